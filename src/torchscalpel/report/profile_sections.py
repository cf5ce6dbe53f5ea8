"""Profile sections of the HTML report: headline figures, per-step breakdown, loss, memory, top ops."""

from __future__ import annotations

from html import escape

from torchscalpel.record import PHASES, RunRecord
from torchscalpel.report import charts
from torchscalpel.report.html import Section, table
from torchscalpel.report.terminal import fmt_flops
from torchscalpel.sections import TraceSection
from torchscalpel.units import fmt_bytes


def build(record: RunRecord) -> list[Section]:
    """All profile sections for ``record`` (the environment section is env_sections' job)."""
    sections = [_overview(record)]
    if record.steps:
        sections.append(_steps(record))
        sections.append(_loss_and_memory(record))
    if record.op_summary_view().top_ops:
        sections.append(_top_ops(record))
    if record.modules:
        sections.append(_modules(record))
    sections.extend(_trace_extras(record))
    return sections


def _overview(record: RunRecord) -> Section:
    s = record.summary_view()
    config = record.config_view()
    kpis = []
    if s.median_step_ms is not None:
        kpis.append(("median step", f"{s.median_step_ms:.2f} ms"))
        kpis.append(("p90 step", f"{s.p90_step_ms:.2f} ms"))
    if s.samples_per_s is not None:
        kpis.append(("throughput", f"{s.samples_per_s:.1f} samples/s"))
    if s.achieved_flops_per_s is not None:
        kpis.append(("achieved", fmt_flops(s.achieved_flops_per_s)))
    if s.mfu is not None:
        kpis.append(("MFU (bf16 peak)", f"{100 * s.mfu['mfu']:.1f}%"))
    if s.cuda_allocated_peak is not None:
        kpis.append(("CUDA allocated peak", fmt_bytes(s.cuda_allocated_peak)))
    mem_peak = (record.op_summary_view().memory or {}).get("peak_bytes")
    if mem_peak:
        kpis.append(("allocator peak (window)", fmt_bytes(mem_peak)))
    if s.rss_peak is not None:
        kpis.append(("RSS peak", fmt_bytes(s.rss_peak)))
    body = '<div class="kpis">' + "".join(
        f'<div class="kpi"><b>{escape(v)}</b><span class="muted">{escape(k)}</span></div>' for k, v in kpis
    ) + "</div>"
    facts = [
        f"status <b>{escape(record.status)}</b>" + (f" (exit code {record.exit_code})" if record.exit_code else ""),
        f"{s.steps_measured} measured steps after {config.warmup} warm-up; "
        f"steps delimited by {escape(record.step_kind)} calls; timing clock: {escape(str(config.clock or '?'))}",
    ]
    if record.error:
        facts.append(f'<span class="sev-error">{escape(record.error)}</span>')
    facts += [f"note: {escape(n)}" for n in record.notes]
    body += "<ul>" + "".join(f"<li>{f}</li>" for f in facts) + "</ul>"
    return Section(id="overview", title="Overview", body=body)


def _steps(record: RunRecord) -> Section:
    # Warm-up steps hold one-off start-up work (imports, data set-up, compilation) that would
    # flatten every other bar, so the chart shows measured steps only.
    steps = record.measured_steps or record.steps
    labels = [str(s.index) + ("w" if s.warmup else "p" if s.profiled else "") for s in steps]
    series = {p: [s.phase_ms()[p] for s in steps] for p in PHASES}
    chart = charts.stacked_bars("step-breakdown", labels, series, unit="ms")
    s = record.summary_view()
    rows = []
    if s.phase_mean_ms is not None:
        share = s.phase_share or {}
        rows = [(p, f"{s.phase_mean_ms[p]:.3f}", f"{100 * share[p]:.1f}%") for p in PHASES]
        rows.append(("step (mean)", f"{s.mean_step_ms:.3f}", "100%"))
    note = (
        '<p class="muted">Each bar is one measured step (p: inside the profiler window, left out of the '
        "summary). The five phases add up to the step's wall time; <i>other</i> is what lies outside data "
        "loading, model forward, backward and optimizer (logging, loss code, zero_grad, evaluation).</p>"
    )
    return Section(
        id="steps",
        title="Per-step breakdown",
        body=chart + note + table(["phase", "mean ms", "share"], rows, [False, True, True]),
    )


def _loss_and_memory(record: RunRecord) -> Section:
    xs = [s.index for s in record.steps]
    parts = []
    if any(s.loss is not None for s in record.steps):
        parts.append("<h3>Loss</h3>" + charts.lines("loss", xs, {"loss": [s.loss for s in record.steps]}))
    mem: dict[str, list[float | None]] = {}
    if any(s.cuda_allocated_peak is not None for s in record.steps):
        mem["CUDA allocated peak (MiB)"] = [(s.cuda_allocated_peak or 0) / 2**20 for s in record.steps]
        mem["CUDA reserved peak (MiB)"] = [(s.cuda_reserved_peak or 0) / 2**20 for s in record.steps]
    if any(s.rss for s in record.steps):
        mem["RSS (MiB)"] = [(s.rss / 2**20) if s.rss else None for s in record.steps]
    if mem:
        parts.append("<h3>Memory over steps</h3>" + charts.lines("memory", xs, mem, unit="MiB"))
    return Section(id="loss-memory", title="Loss and memory", body="".join(parts) or "<p>No loss or memory data.</p>")


def _top_ops(record: RunRecord) -> Section:
    summary = record.op_summary_view()
    profiler = record.profiler_view()
    ops = (summary.top_ops or [])[:15]
    chart = charts.horizontal_bars("top-ops", [(o["name"], o["self_us"] / 1000.0) for o in ops], unit="ms")
    flops = {f["name"]: f["flops"] for f in profiler.flops_by_op}
    rows = [
        (o["name"], o.get("category", ""), o.get("count", ""), f"{o['self_us'] / 1000:.3f}", f"{o.get('total_us', 0) / 1000:.3f}",
         f"{flops[o['name']]:.3g}" if o["name"] in flops else "")
        for o in ops
    ]
    cats = summary.categories or {}
    cat_chart = charts.horizontal_bars(
        "op-categories", sorted(((k, v / 1000.0) for k, v in cats.items()), key=lambda kv: -kv[1]), unit="ms"
    ) if cats else ""
    return Section(
        id="top-ops",
        title=f"Top ops (profiler window: steps {profiler.steps})",
        body=chart
        + table(["op", "category", "calls", "self ms", "total ms", "FLOPs"], rows, [False, False, True, True, True, True])
        + ("<h3>Self time by category</h3>" + cat_chart if cat_chart else ""),
    )


def _modules(record: RunRecord) -> Section:
    rows = [(m["name"], m["type"], f"{m['params']:,}", m["calls"], f"{m['forward_ms']:.3f}") for m in record.modules[:25]]
    return Section(
        id="modules",
        title="Forward time by module",
        body=table(["module", "type", "params", "calls", "forward ms (measured steps)"], rows, [False, False, True, True, True]),
    )


# Parts of the shared trace component that add to the profile sections above (the op table
# there already carries FLOPs, which the exported trace lacks).
_TRACE_PARTS = ("trace-gpu", "trace-kernels", "trace-memory", "trace-errors")


def _trace_extras(record: RunRecord) -> list[Section]:
    trace = record.section(TraceSection)
    if trace is None or not trace.to_dict():
        return []
    from torchscalpel.report.trace_sections import build_trace_sections

    return [s for s in build_trace_sections(trace.to_dict()) if s.id in _TRACE_PARTS]

"""Profile sections of the HTML report: headline figures, per-step breakdown, loss, memory, top ops."""

from __future__ import annotations

from html import escape
from typing import Any

from torchscalpel.doctor import eval_curve
from torchscalpel.record import PHASES, RunRecord
from torchscalpel.report import charts
from torchscalpel.report.page import Section, code_spans, table
from torchscalpel.report.profile_terminal import (
    fmt_count,
    fmt_flops,
    left_out_text,
    op_lines_text,
    op_sites,
    phase_medians,
    phase_shares,
    site_text,
    strip_ansi,
    summarized_steps,
    uncounted_text,
    window_step_us,
)
from torchscalpel.runtime.run_notes import how_it_stopped
from torchscalpel.sections import EvalSection, TraceSection
from torchscalpel.units import fmt_bytes


def build(record: RunRecord) -> list[Section]:
    """All profile sections for ``record`` (the environment section is env_sections' job)."""
    overview = _overview(record)
    sections = [overview] if overview is not None else []
    verdict = _verdict(record)
    if verdict is not None:
        sections.insert(0, verdict)
    if record.steps:
        sections.append(_steps(record))
        sections.append(_loss_and_memory(record))
    if record.op_summary_view().top_ops:
        sections.append(_top_ops(record))
    if record.modules:
        sections.append(_modules(record))
    sections.extend(_trace_extras(record))
    return sections


PHASE_NEXT = {
    "data": "the loop waits for its data: DataLoader workers, pinned memory and persistent workers "
    "are what `scalpel tune` tries for it",
    "forward": "compute in the model: mixed precision (AMP) and torch.compile are what `scalpel tune` tries for it",
    "backward": "compute in the backward pass: mixed precision (AMP) and torch.compile are what `scalpel tune` "
    "tries for it",
    "optimizer": "the optimizer step: a fused optimizer is what `scalpel tune` tries for it",
    "other": "time outside data, forward, backward and the optimizer (Python between steps, logging, "
    "synchronizations): `scalpel doctor` looks for the usual causes",
}
"""Per phase that takes most of the step: what that means and what tries to shorten it."""


STATUS_MEANS = {
    "stopped": "not a failure: the rest of the script was skipped",
    "partial": "the run ended before its record was finished",
    "failed": "what was measured before the error is kept",
    "interrupted": "what was measured before it is kept",
}
"""What a run status means beside :func:`how_it_stopped`'s reason: "stopped" read as a failure."""


def _verdict(record: RunRecord) -> Section | None:
    """Where the median step goes and what to run next: the page's first section (the terminal's
    summary ends with the same next step)."""
    s = record.summary_view()
    if s.median_step_ms is None or not record.steps:
        return None
    medians, shares = phase_medians(record), phase_shares(record)
    top = max(PHASES, key=lambda p: shares.get(p, 0.0))
    body = (
        f"<p>The median step takes <b>{s.median_step_ms:.2f} ms</b>; the largest part is <b>{escape(top)}</b>: "
        f"{medians[top]:.2f} ms, {100 * shares[top]:.0f}% of it. That is {code_spans(PHASE_NEXT[top])}.</p>"
        + profile_next(record)
    )
    return Section(id="profile-verdict", title="Verdict: where the step goes", body=body)


STAGE_SECTIONS = ("doctor", "tune", "memory", "lr", "batch", "plan", "fix")
"""Sections of a later stage: a record holding one is that stage's page, whose own verdict says what is next."""


def profile_next(record: RunRecord) -> str:
    """The profile page's next step: doctor then tune on the script (CLI words), or the in-process doctor on the
    same block (a notebook's words); nothing on a later stage's page, which says its own next step."""
    if any(key in record.sections for key in STAGE_SECTIONS):
        return ""
    target = record.target
    if "inprocess" in target and not target.get("script") and not target.get("module"):
        return (
            "<p>Next: wrap the same training code in <code>with torchscalpel.doctor() as run:</code> (findings "
            "with fixes); for measured speedups, <code>scalpel tune -- train.py</code> on it as a script.</p>"
        )
    script = target.get("script") or (f"-m {target['module']}" if target.get("module") else "SCRIPT")
    return (
        f"<p>Next: <code>scalpel doctor -- {escape(str(script))}</code> (findings with fixes), then "
        f"<code>scalpel tune -- {escape(str(script))}</code> (measured, numerics-checked speedups).</p>"
    )


def _overview(record: RunRecord) -> Section | None:
    """Headline figures and how the run went; None for a record without steps that has nothing to say
    about a run (a plan or a hand-made record), rather than "0 measured steps ... clock: ?"."""
    s = record.summary_view()
    config = record.config_view()
    kpis = []
    if s.median_step_ms is None and s.step_time_not_measured:
        kpis.append(("step time", f"not measured: {s.step_time_not_measured}"))
    if s.median_step_ms is not None:
        kpis.append(("median step", f"{s.median_step_ms:.2f} ms"))
        kpis.append(("p90 step", f"{s.p90_step_ms:.2f} ms"))
        kpis.append(("steps in these figures", f"{s.steps_summarized}"))
    if s.samples_per_s is not None:
        kpis.append(("throughput", f"{s.samples_per_s:.1f} samples/s"))
    elif s.samples_per_s_not_measured:
        kpis.append(("throughput", f"not measured: {s.samples_per_s_not_measured}"))
    if s.flops_per_step is not None:
        kpis.append(("FLOP per step", f"{fmt_count(s.flops_per_step)}FLOP"))
    elif s.flops_not_measured:
        kpis.append(("FLOP per step", f"not measured: {s.flops_not_measured}"))
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
    body = (
        '<div class="kpis">'
        + "".join(
            f'<div class="kpi"><b>{escape(v)}</b><span class="muted">{escape(k)}</span></div>'
            for k, v in kpis
        )
        + "</div>"
    )
    if not record.steps and not kpis and not record.error and not record.exit_code:
        return None
    facts = [
        f"status <b>{escape(record.status)}</b>"
        + f": {escape(how_it_stopped(record))}"
        + (f" ({escape(STATUS_MEANS[record.status])})" if record.status in STATUS_MEANS else "")
        + (f" (exit code {record.exit_code})" if record.exit_code else "")
    ]
    if record.steps:
        clock = f"; timing clock: {escape(str(config.clock))}" if config.clock else ""
        facts.append(
            f"{s.steps_measured} measured steps after {config.warmup} warm-up; "
            f"steps delimited by {escape(record.step_kind)} calls{clock}"
        )
        if s.median_step_ms is not None:
            facts.append(_statistic_note(record))
    if record.error:
        facts.append(f'<span class="sev-error">{escape(strip_ansi(record.error))}</span>')
    if s.flops_per_step is not None:
        recompute = (
            f", plus {fmt_count(s.recompute_flops_per_step)}FLOP of checkpoint recomputation"
            if s.recompute_flops_per_step
            else ""
        )
        facts.append(
            f"FLOPs counted over step {record.profiler_view().flops_step} (forward, backward and optimizer, "
            f"FlopCounterMode's formulas){recompute}; FLOP/s over the median step"
        )
        left_out = uncounted_text(record)
        if left_out:
            facts.append(escape(left_out))
        if s.eval_flops:
            facts.append(
                f"evaluation forwards (without grad) between steps: {fmt_count(s.eval_flops)}FLOP, counted apart, "
                "not in FLOPs per step"
            )
    elif s.flops_not_measured:
        facts.append(f"FLOPs not measured: {escape(s.flops_not_measured)}")
    facts += [f"note: {escape(n)}" for n in record.notes]
    body += "<ul>" + "".join(f"<li>{f}</li>" for f in facts) + "</ul>"
    return Section(id="overview", title="Overview", body=body)


def _statistic_note(record: RunRecord) -> str:
    """Which steps and which statistic the headline and the phase table use (the same in both)."""
    s = record.summary_view()
    left_out = left_out_text(record)
    which = f"{s.steps_summarized} measured step(s)" + (
        f", the {left_out} step(s) left out (instrumentation slows them)" if left_out else ""
    )
    return f"step and phase times are medians over {which}"


def _steps(record: RunRecord) -> Section:
    # Warm-up steps hold one-off start-up work (imports, data set-up, compilation) that would
    # flatten every other bar, so the chart shows measured steps only.
    steps = record.measured_steps or record.steps
    labels = [
        str(s.index) + ("w" if s.warmup else "f" if s.flops_counted else "p" if s.profiled else "")
        for s in steps
    ]
    series = {p: [s.phase_ms()[p] for s in steps] for p in PHASES}
    x_title = "step" + (
        " (p: in the profiler window, f: FLOP-counting)" if any(st.profiled for st in steps) else ""
    )
    chart = charts.stacked_bars(
        "step-breakdown", labels, series, unit="ms", x_title=x_title, y_title="step time (ms)"
    )
    s = record.summary_view()
    rows = []
    medians = phase_medians(record)
    if medians and s.median_step_ms is not None:
        shares = phase_shares(record)
        rows = [(p, f"{medians[p]:.3f}", f"{100 * shares[p]:.1f}%") for p in PHASES]
        rows.append(("step", f"{s.median_step_ms:.3f}", "100%"))
    note = (
        '<p class="muted">Each bar is one measured step (p: inside the profiler window, f: the FLOP-counting '
        "step; both left out of the table). The five phases add up to the step's wall time; <i>other</i> is "
        "what lies outside data loading, model forward, backward and optimizer (logging, loss code, zero_grad, "
        f"evaluation). The table gives medians over {len(summarized_steps(record))} step(s), as the headline "
        "does, and each share is the phase's median over the median step; the phase medians (and so the "
        "shares) need not add up to the step's.</p>"
    )
    return Section(
        id="steps",
        title="Per-step breakdown",
        body=chart + note + table(["phase", "median ms", "of median step"], rows, [False, True, True]),
    )


def _loss_and_memory(record: RunRecord) -> Section:
    xs = [s.index for s in record.steps]
    parts = []
    evaluation = record.section(EvalSection)
    if evaluation is not None and evaluation.passes:
        parts.append(_loss_with_validation(record, evaluation))
    elif any(s.loss is not None for s in record.steps):
        parts.append(
            "<h3>Loss</h3>"
            + charts.lines(
                "loss", xs, {"loss": [s.loss for s in record.steps]}, y_title="loss (the script's own)"
            )
        )
    mem: dict[str, list[float | None]] = {}
    if any(s.cuda_allocated_peak is not None for s in record.steps):
        mem["CUDA allocated peak"] = [(s.cuda_allocated_peak or 0) / 2**20 for s in record.steps]
        mem["CUDA reserved peak"] = [(s.cuda_reserved_peak or 0) / 2**20 for s in record.steps]
    if any(s.rss for s in record.steps):
        mem["process RSS"] = [(s.rss / 2**20) if s.rss else None for s in record.steps]
    if mem:
        title = "process RSS (MiB)" if list(mem) == ["process RSS"] else "memory (MiB)"
        parts.append(
            "<h3>Memory over steps</h3>" + charts.lines("memory", xs, mem, unit="MiB", y_title=title)
        )
    return Section(
        id="loss-memory", title="Loss and memory", body="".join(parts) or "<p>No loss or memory data.</p>"
    )


VERDICT_WORDS = {
    eval_curve.OVERFITTING: "overfitting: the validation loss rose from its best while the training loss kept falling "
    "(keep the best evaluation's weights; regularise)",
    eval_curve.OSCILLATING: "oscillating: the validation loss jumps up and down between evaluations (a learning rate "
    "too high, or an evaluation set too small)",
    eval_curve.PLATEAU: "plateau: the validation loss stopped improving over the last evaluations (decay the "
    "learning rate, or stop early)",
}
"""What the page says beside the validation curve for each verdict of :func:`torchscalpel.doctor.eval_curve.judge`."""


def _loss_with_validation(record: RunRecord, evaluation: EvalSection) -> str:
    """The training loss per step with the loss of each evaluation pass (at the step count it ran after), and
    the curve's verdict; a curve too short to judge says so."""
    passes = {int(p["step"]): p["loss"] for p in evaluation.passes if p.get("loss") is not None}
    train = {s.index: s.loss for s in record.steps}
    xs = sorted(set(train) | set(passes))
    chart = charts.lines(
        "loss",
        xs,
        {"training": [train.get(x) for x in xs], "validation": [passes.get(x) for x in xs]},
        y_title="loss (the script's own; validation: mean per evaluation pass)",
    )
    usable = eval_curve.usable_passes(evaluation.passes)
    measured = [(s.index, float(s.loss)) for s in record.steps if isinstance(s.loss, int | float)]
    verdict = eval_curve.judge(usable, measured)
    if verdict is not None:
        said = f"Validation curve: {VERDICT_WORDS[verdict.slug]}."
    elif len(usable) < eval_curve.MIN_PASSES:
        said = (
            f"{len(usable)} evaluation pass(es): too few to judge the curve "
            f"(overfitting, plateau and oscillation need {eval_curve.MIN_PASSES})."
        )
    else:
        said = (
            f"Validation curve over {len(usable)} evaluation passes: no overfitting, plateau or oscillation."
        )
    return f"<h3>Loss</h3>{chart}<p>{escape(said)}</p>"


def _top_ops(record: RunRecord) -> Section:
    summary = record.op_summary_view()
    profiler = record.profiler_view()
    ops = (summary.top_ops or [])[:15]
    chart = charts.horizontal_bars(
        "top-ops",
        [(o["name"], o["self_us"] / 1000.0) for o in ops],
        unit="ms",
        x_title="self time in the profiler window (ms)",
        y_title="op",
    )
    flops = {f["name"]: f["flops"] + f.get("recompute", 0) for f in profiler.flops_by_op}
    step_us, sites = window_step_us(record), op_sites(record)
    rows = [
        (
            o["name"],
            o.get("category", ""),
            o.get("count", ""),
            f"{o['self_us'] / 1000:.3f}",
            f"{100 * o['self_us'] / step_us:.1f}%" if step_us else "",
            f"{o.get('total_us', 0) / 1000:.3f}",
            f"{flops[o['name']]:.3g}" if o["name"] in flops else "",
            _site_cell(sites.get(o["name"])),
        )
        for o in ops
    ]
    cats = summary.categories or {}
    cat_chart = (
        charts.horizontal_bars(
            "op-categories",
            sorted(((k, v / 1000.0) for k, v in cats.items()), key=lambda kv: -kv[1]),
            unit="ms",
            x_title="self time in the profiler window (ms)",
            y_title="category",
        )
        if cats
        else ""
    )
    return Section(
        id="top-ops",
        title=f"Top ops (profiler window: steps {profiler.steps})",
        body=chart
        + table(
            ["op", "category", "calls", "self ms", "of step", "total ms", "FLOPs", "at (user line)"],
            rows,
            [False, False, True, True, True, True, True, False],
        )
        + _op_lines_note(record)
        + ("<h3>Self time by category</h3>" + cat_chart if cat_chart else "")
        + _flops_table(record),
    )


def _site_cell(row: dict[str, Any] | None) -> str:
    """An op's user line from the op-line pass, with its share of the op when other lines share it."""
    if not row:
        return ""
    share = row.get("site_share", 1.0)
    shapes = row.get("shapes") or []
    text = site_text(row["site"]) + (f" ({100 * share:.0f}% of the op)" if share < 0.995 else "")
    return text + (f", shapes {shapes}" if shapes else "")


def _op_lines_note(record: RunRecord) -> str:
    text = op_lines_text(record)
    return f"<p>{escape(text)}</p>" if text else ""


def _flops_table(record: RunRecord) -> str:
    """Every op that counted FLOPs in the FLOP-counting step (the rows sum to the step's figure)."""
    profiler = record.profiler_view()
    if profiler.flops_step is None or not profiler.flops_by_op:
        return ""
    rows = [
        (f["name"], f["count"], f"{f['flops']:.4g}", f"{f.get('recompute', 0):.4g}")
        for f in profiler.flops_by_op
    ]
    rows.append(("total", "", f"{profiler.flops_total or 0:.4g}", f"{profiler.flops_recompute or 0:.4g}"))
    return f"<h3>FLOPs by op (step {profiler.flops_step})</h3>" + table(
        ["op", "calls", "FLOPs", "recompute FLOPs"], rows, [False, True, True, True]
    )


def _modules(record: RunRecord) -> Section:
    rows = [
        (m.get("shown") or m["name"], m["type"], f"{m['params']:,}", m["calls"], f"{m['forward_ms']:.3f}")
        for m in record.modules[:25]
    ]
    return Section(
        id="modules",
        title="Forward time by module",
        body=table(
            ["module", "type", "params", "calls", "forward ms (measured steps)"],
            rows,
            [False, False, True, True, True],
        ),
    )


# Parts of the shared trace component that add to the profile sections above (the op table
# there already carries FLOPs, which the exported trace lacks).
_TRACE_PARTS = ("trace-gpu", "trace-kernels", "trace-memory", "trace-errors")


def _trace_extras(record: RunRecord) -> list[Section]:
    trace = record.section(TraceSection)
    if trace is None or not trace.to_dict():
        return []
    import torchscalpel.report.trace_sections as trace_sections

    return [s for s in trace_sections.build(trace.to_dict()) if s.id in _TRACE_PARTS]

"""Terminal output with rich: live progress while a script runs, and the profile summary."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from torchscalpel.console import console, say, say_command
from torchscalpel.envcheck.host_checks import check_machine_busy
from torchscalpel.findings import short_path
from torchscalpel.record import PHASES, RunRecord, StepRecord
from torchscalpel.runtime.native_log import LOG_NAME
from torchscalpel.runtime.run_notes import how_it_stopped
from torchscalpel.runtime.script import strip_ansi  # the runtime strips errors before they reach the record
from torchscalpel.trace.patterns import PATTERN_RULES
from torchscalpel.units import fmt_bytes

PHASE_SUM_SLACK = 0.05
"""Phase shares further than this from 100% of the median step get a line saying why."""


def _figure(value: float | None, spec: str) -> str:
    """A summary figure, or "-" where a hand-made or partial summary left it out beside the others."""
    return "-" if value is None else format(value, spec)


def summarized_steps(record: RunRecord) -> list[StepRecord]:
    """The steps the record's summary covers: measured ones no instrument slowed (the rule of
    :func:`torchscalpel.runtime.summary.run_summary`; none when every measured step was instrumented)."""
    return record.timed_steps


def phase_medians(record: RunRecord) -> dict[str, float]:
    """The median of each phase over :func:`summarized_steps` (empty without steps): the same statistic
    and steps as the headline's median step."""
    steps = summarized_steps(record)
    if not steps:
        return {}
    return {p: statistics.median(s.phase_ms()[p] for s in steps) for p in PHASES}


def phase_shares(record: RunRecord) -> dict[str, float]:
    """Each phase's median over the median step: the share of the same statistic as
    :func:`phase_medians` (a mean share beside a median let one outlier step give a 0.04 ms phase
    a 56.7% share). Need not sum to 100%."""
    medians, step = phase_medians(record), record.summary_view().median_step_ms
    return {p: (v / step if step else 0.0) for p, v in medians.items()}


def left_out_text(record: RunRecord) -> str:
    """Which instrumented steps the timing figures leave out ("2 profiled, 1 FLOP-counting")."""
    s = record.summary_view()
    left_out = (
        [st for st in record.measured_steps if st.profiled] if s.steps_summarized < s.steps_measured else []
    )
    counted = sum(1 for st in left_out if st.flops_counted)
    lines = sum(1 for st in left_out if st.op_lines)
    parts = [f"{len(left_out) - counted - lines} profiled"] if len(left_out) > counted + lines else []
    if counted:
        parts.append(f"{counted} FLOP-counting")
    if lines:
        parts.append(f"{lines} op-line")
    return ", ".join(parts)


def window_step_us(record: RunRecord) -> float:
    """Wall time of the profiler window's steps (µs): the denominator of an op's share of the step."""
    window = set(record.profiler_view().steps or [])
    return sum(st.total_ms for st in record.steps if st.index in window) * 1000.0


def op_sites(record: RunRecord) -> dict[str, dict[str, Any]]:
    """Each top op's user line from the op-line pass, by op name."""
    lines = record.profiler_view().op_lines or {}
    return {o["name"]: o for o in lines.get("ops", []) if o.get("site")}


def site_text(site: str) -> str:
    """``file:line`` with the file relative to the current folder when it lies under it."""
    file, _, line = site.rpartition(":")
    return f"{short_path(file)}:{line}"


def _own_attention(finding: dict[str, Any]) -> bool:
    """An unfused-attention finding in the user's own code (``scalpel fix`` patches those, not a library's)."""
    return finding.get("rule") == "unfused-attention" and "(library code)" not in str(
        finding.get("message", "")
    )


def op_lines_text(record: RunRecord) -> str | None:
    """What the op-line pass cost, or why it did not run (None: not asked)."""
    lines = record.profiler_view().op_lines
    if lines is None:
        return None
    if lines.get("error"):
        return f"op lines: not measured: {lines['error']}"
    seconds = lines.get("seconds")
    cost = f"{seconds:.2f} s" if isinstance(seconds, int | float) else "not measured"
    return f"op lines: 1 pass over step(s) {lines.get('steps')}, {cost}, left out of the step times"


def flops_text(record: RunRecord) -> str | None:
    """FLOPs per step, with FLOP/s and recomputation, or why they were not measured (None: not asked)."""
    s = record.summary_view()
    if s.flops_per_step is None:
        return f"FLOPs: not measured: {s.flops_not_measured}" if s.flops_not_measured else None
    text = f"{fmt_count(s.flops_per_step)}FLOP per step"
    if s.recompute_flops_per_step:
        text += f" (+{fmt_count(s.recompute_flops_per_step)}FLOP checkpoint recompute)"
    if s.achieved_flops_per_s is not None:
        text += f", {fmt_flops(s.achieved_flops_per_s)} achieved"
    left_out = uncounted_text(record)
    if left_out:
        text += f"; {left_out}"
    if s.eval_flops or s.training_step_ms is not None:
        figures = [f"{fmt_count(s.eval_flops)}FLOP"] if s.eval_flops else []
        if s.training_step_ms is not None and s.median_step_ms is not None:
            figures.append(f"{max(s.median_step_ms - s.training_step_ms, 0.0):.2f} ms of the median step")
        text += (
            f"; evaluation forwards between steps ({', '.join(figures)}) left out of the FLOPs and of the time "
            "FLOP/s is over"
        )
    return text


def uncounted_text(record: RunRecord) -> str | None:
    """The ops FLOPs per step leave out (no FLOP formula) with their share of op time, or None when none
    took more than a few percent."""
    rows = record.summary_view().flops_uncounted
    if not rows:
        return None
    named = ", ".join(f"{r['name']} ({100 * r['share']:.1f}% of op time)" for r in rows[:4])
    more = f" and {len(rows) - 4} more" if len(rows) > 4 else ""
    return f"not counted (no FLOP formula): {named}{more}"


def fmt_count(n: float) -> str:
    """A count with an SI prefix and a trailing space ("461.6 M")."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} "


def fmt_flops(n: float | None) -> str:
    """FLOP/s with an SI prefix."""
    if not n:
        return "-"
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} FLOP/s"


def table_width(headers: list[str], rows: list[list[str]]) -> int:
    """Columns a rich table of these cells takes unwrapped: each column's widest cell, plus its padding and rule."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    return sum(widths) + 3 * len(widths) + 1


def print_rows(
    out: Console, headers: list[str], rows: list[list[str]], *, right: tuple[str, ...] = ()
) -> None:
    """A table whose cells never wrap: as a table when it fits the width; otherwise each row as a line of
    ``header value`` pairs (its first cell leading), wrapped between pairs, so that no figure, line number or
    path is cut (at 80 columns ``train_char.py:17`` was folded into ``train_char.py:1`` / ``7``)."""
    if table_width(headers, rows) <= out.width:
        t = Table()
        for h in headers:
            t.add_column(h, justify="right" if h in right else "left", no_wrap=True)
        for row in rows:
            t.add_row(*(escape(str(cell)) for cell in row))
        out.print(t)
        return
    for row in rows:
        pairs = [f"{h} {cell}" for h, cell in zip(headers[1:], row[1:], strict=True) if str(cell)]
        say(out, f"{row[0]}: " + " · ".join(pairs), hang=2, sep=" · ")


def render(record: RunRecord, run_dir: Any, out: Console | None = None) -> None:
    """The one-screen summary of a profile run."""
    c = out or console()
    s = record.summary_view()
    config = record.config_view()
    profiler = record.profiler_view()
    ops_summary = record.op_summary_view()
    status_style = {"complete": "green", "stopped": "green", "failed": "red", "interrupted": "yellow"}.get(
        record.status, "yellow"
    )
    # why the run ended is a clause with figures (say: wrapped between words, never inside a figure)
    say(
        c,
        f"[bold]scalpel profile[/] {escape(str(record.target.get('script') or record.target.get('module')))}: "
        f"[{status_style}]{escape(how_it_stopped(record))}[/]; {s.steps_measured} measured steps "
        f"(+{config.warmup} warm-up), steps = {record.step_kind} calls, "
        f"clock = {config.clock or '?'}",
        markup=True,
    )
    for note in record.notes:
        say(c, f"[yellow]note:[/] {escape(strip_ansi(note))}", markup=True)
    for busy in check_machine_busy(record.environment):  # step times measured on a busy machine are noisy
        say(c, f"[yellow]note:[/] {escape(busy.message)}", markup=True)
    if s.median_step_ms is None:
        if s.step_time_not_measured:
            say(
                c,
                f"[bold]step time[/]: [yellow]not measured: {escape(s.step_time_not_measured)}[/]",
                markup=True,
            )
            flops = flops_text(record)
            if flops:
                say(c, flops)
        else:
            c.print("[yellow]No measured steps to summarise.[/]")
    else:
        left_out = left_out_text(record)
        which = f"over {s.steps_summarized} step(s)" + (f", {left_out} left out" if left_out else "")
        say(
            c,
            f"[bold]step time[/]: median {s.median_step_ms:.2f} ms, p90 {_figure(s.p90_step_ms, '.2f')} ms ({which})",
            markup=True,
        )
        medians, shares = phase_medians(record), phase_shares(record)
        table = Table()
        table.add_column("phase", no_wrap=True)
        table.add_column("median ms", justify="right", no_wrap=True)
        table.add_column("of median step", justify="right", no_wrap=True)
        for (
            p
        ) in PHASES:  # no medians: the summary names steps the record does not hold (report --check says so)
            table.add_row(
                p,
                f"{medians[p]:.2f}" if p in medians else "-",
                f"{100 * shares[p]:.1f}%" if p in shares else "-",
            )
        table.add_row("[bold]step[/]", f"[bold]{s.median_step_ms:.2f}[/]", "100%")
        c.print(table)
        total = sum(shares.values())
        if shares and abs(total - 1.0) > PHASE_SUM_SLACK:
            # each phase's median is its own: summed they are not the median step (seen 115.7% unexplained)
            say(
                c,
                f"phase shares add up to {100 * total:.1f}%: each phase's median is taken on its own over the "
                "same steps, so they need not sum to the median step",
            )
        extras = []
        if s.samples_per_s is not None:
            extras.append(f"throughput {s.samples_per_s:.1f} samples/s")
        elif s.samples_per_s_not_measured:
            extras.append(f"samples/s not measured: {s.samples_per_s_not_measured}")
        if s.first_loss is not None:
            extras.append(f"loss {s.first_loss:.4g} -> {_figure(s.last_loss, '.4g')}")
        flops = flops_text(record)
        if flops:
            extras.append(flops)
        if s.mfu is not None:
            extras.append(f"MFU {100 * s.mfu['mfu']:.1f}% of {s.mfu['gpu']} bf16 peak")
        mem = []
        if s.cuda_allocated_peak is not None:
            mem.append(
                f"CUDA allocated peak {fmt_bytes(s.cuda_allocated_peak)}, reserved {fmt_bytes(s.cuda_reserved_peak)}"
            )
        window_peak = (ops_summary.memory or {}).get("peak_bytes")
        if window_peak:
            mem.append(f"allocator peak in profiler window {fmt_bytes(window_peak)}")
        if s.rss_peak is not None:
            mem.append(f"RSS peak {fmt_bytes(s.rss_peak)}")
        if extras:
            say(c, " · ".join(extras))
        if mem:
            say(c, "memory: " + " · ".join(mem))
    ops = ops_summary.top_ops or []
    if ops:
        c.print(f"[bold]top ops by self time[/] (profiler window, steps {profiler.steps})")
        step_us, sites = window_step_us(record), op_sites(record)
        headers = ["op", "category", "calls", "self ms"]
        headers += ["of step"] if step_us else []
        headers += ["at (user line)"] if sites else []
        rows = []
        for op in ops[:8]:
            name = op["name"] if len(op["name"]) <= 160 else op["name"][:159] + "…"
            row = [name, op.get("category", ""), str(op.get("count", "")), f"{op['self_us'] / 1000:.2f}"]
            if step_us:
                row.append(f"{100 * op['self_us'] / step_us:.0f}%")
            if sites:
                where = sites.get(op["name"])
                row.append(
                    site_text(where["site"])
                    + (f" ({100 * where['site_share']:.0f}%)" if where["site_share"] < 0.995 else "")
                    if where
                    else ""
                )
            rows.append(row)
        print_rows(c, headers, rows, right=("calls", "self ms", "of step"))
    lines_note = op_lines_text(record)
    if lines_note:
        say(c, lines_note)
    for f in record.findings:
        if f.get("rule") not in PATTERN_RULES:
            continue
        loc = f.get("location")
        at = " at " + site_text(f"{loc['file']}:{loc['line']}") if loc else ""
        c.print(f"[bold]{escape(f['rule'])}[/]{escape(at)}: {escape(f.get('message', ''))}")
        c.print(f"  fix: {escape(f.get('fix', ''))}")
    if any(_own_attention(f) for f in record.findings):
        say(
            c,
            f"patch it: scalpel fix {run_dir} --verify (the fused call in your attention code, its outputs checked)",
        )
    files = ["run.json", "report.html", *([profiler.trace] if profiler.trace else [])]
    if (Path(run_dir) / LOG_NAME).exists():
        files.append(f"{LOG_NAME}: the profiler's own messages")
    c.print(f"run folder: [bold]{run_dir}[/] ({', '.join(files)})")
    if record.error:
        c.print(f"[red]script error:[/] {escape(strip_ansi(record.error))}")
    script = record.target.get("script") or (
        f"-m {record.target['module']}" if record.target.get("module") else None
    )
    if script and record.steps:
        say_command(
            c, "next:", f"scalpel doctor -- {script}", f"(findings with fixes), open {run_dir}/report.html"
        )
    sys.stderr.flush()

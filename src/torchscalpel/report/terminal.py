"""Terminal output with rich: live progress while a script runs, and the profile summary."""

from __future__ import annotations

import statistics
import sys
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from torchscalpel.record import PHASES, RunRecord, StepRecord
from torchscalpel.units import fmt_bytes


def console() -> Console:
    """The console for scalpel's own output: stderr, so a script's stdout stays clean for pipes."""
    return Console(stderr=True, highlight=False)


class StepProgress:
    """A progress bar over the steps, updated from the runtime's step-end events.

    The script's own prints still appear (rich redirects them above the bar); on a non-terminal
    stream the bar is not drawn, so logs stay readable.
    """

    def __init__(self, total: int | None, label: str) -> None:
        self.console = console()
        self.enabled = self.console.is_terminal
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self._task = self._progress.add_task(label, total=total, info="starting")

    def __enter__(self) -> StepProgress:
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self.enabled:
            self._progress.stop()

    def update(self, step: StepRecord) -> None:
        """Advance by one step and show its time and loss."""
        loss = f" loss {step.loss:.4g}" if step.loss is not None else ""
        tag = "warm-up" if step.warmup else ("profiled" if step.profiled else "step")
        self._progress.update(self._task, advance=1, info=f"{tag} {step.total_ms:.1f} ms{loss}")


def summarized_steps(record: RunRecord) -> list[StepRecord]:
    """The steps the record's summary covers: measured ones, profiled ones left out when others exist
    (the rule of :func:`torchscalpel.runtime.summary.run_summary`)."""
    measured = record.measured_steps
    return [s for s in measured if not s.profiled] or measured


def phase_medians(record: RunRecord) -> dict[str, float]:
    """The median of each phase over :func:`summarized_steps` (empty without steps): the same statistic
    and steps as the headline's median step."""
    steps = summarized_steps(record)
    if not steps:
        return {}
    return {p: statistics.median(s.phase_ms()[p] for s in steps) for p in PHASES}


def fmt_flops(n: float | None) -> str:
    """FLOP/s with an SI prefix."""
    if not n:
        return "-"
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} FLOP/s"


def print_profile_summary(record: RunRecord, run_dir: Any, out: Console | None = None) -> None:
    """The one-screen summary of a profile run."""
    c = out or console()
    s = record.summary_view()
    config = record.config_view()
    profiler = record.profiler_view()
    ops_summary = record.op_summary_view()
    status_style = {"complete": "green", "stopped": "green", "failed": "red", "interrupted": "yellow"}.get(
        record.status, "yellow"
    )
    c.print(
        f"[bold]scalpel profile[/] {record.target.get('script') or record.target.get('module')}  "
        f"[{status_style}]{record.status}[/]  {s.steps_measured} measured steps "
        f"(+{config.warmup} warm-up), steps = {record.step_kind} calls, "
        f"clock = {config.clock or '?'}"
    )
    for note in record.notes:
        c.print(f"[yellow]note:[/] {note}")
    if s.median_step_ms is None:
        c.print("[yellow]No measured steps to summarise.[/]")
    else:
        c.print(f"[bold]step time[/]: median {s.median_step_ms:.2f} ms, p90 {s.p90_step_ms:.2f} ms")
        phase_mean, phase_share = s.phase_mean_ms or {}, s.phase_share or {}
        table = Table()
        table.add_column("phase")
        table.add_column("mean ms", justify="right")
        table.add_column("share", justify="right")
        for p in PHASES:
            table.add_row(p, f"{phase_mean[p]:.2f}", f"{100 * phase_share[p]:.1f}%")
        table.add_row("[bold]step[/]", f"[bold]{s.mean_step_ms:.2f}[/]", "100%")
        c.print(table)
        extras = []
        if s.samples_per_s is not None:
            extras.append(f"throughput {s.samples_per_s:.1f} samples/s")
        if s.first_loss is not None:
            extras.append(f"loss {s.first_loss:.4g} -> {s.last_loss:.4g}")
        if s.achieved_flops_per_s is not None:
            extras.append(f"{fmt_flops(s.achieved_flops_per_s)} achieved")
        if s.mfu is not None:
            extras.append(f"MFU {100 * s.mfu['mfu']:.1f}% of {s.mfu['gpu']} bf16 peak")
        mem = []
        if s.cuda_allocated_peak is not None:
            mem.append(f"CUDA allocated peak {fmt_bytes(s.cuda_allocated_peak)}, reserved {fmt_bytes(s.cuda_reserved_peak)}")
        window_peak = (ops_summary.memory or {}).get("peak_bytes")
        if window_peak:
            mem.append(f"allocator peak in profiler window {fmt_bytes(window_peak)}")
        if s.rss_peak is not None:
            mem.append(f"RSS peak {fmt_bytes(s.rss_peak)}")
        if extras:
            c.print(" · ".join(extras))
        if mem:
            c.print("memory: " + " · ".join(mem))
    ops = ops_summary.top_ops or []
    if ops:
        c.print(f"[bold]top ops by self time[/] (profiler window, steps {profiler.steps})")
        t = Table()
        t.add_column("op")
        t.add_column("category")
        t.add_column("calls", justify="right")
        t.add_column("self ms", justify="right")
        for op in ops[:8]:
            t.add_row(op["name"][:60], op.get("category", ""), str(op.get("count", "")), f"{op['self_us'] / 1000:.2f}")
        c.print(t)
    c.print(f"run folder: [bold]{run_dir}[/] (run.json, report.html{', ' + profiler.trace if profiler.trace else ''})")
    if record.error:
        c.print(f"[red]script error:[/] {record.error}")
    sys.stderr.flush()

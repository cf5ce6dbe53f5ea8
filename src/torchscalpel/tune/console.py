"""Terminal output of ``scalpel tune``: progress while trials run, the ranked table, the verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from torchscalpel.report.terminal import console as default_console
from torchscalpel.tune.states import TrialStatus, Verdict
from torchscalpel.units import fmt_bytes

if TYPE_CHECKING:
    from torchscalpel.tune.runner import TrialResult
    from torchscalpel.tune.search import TuneResult

VERDICT_STYLE: dict[Verdict, str] = {
    Verdict.WINNER: "bold green", Verdict.FASTER: "green", Verdict.BASELINE: "bold", Verdict.NOT_FASTER: "yellow",
    Verdict.NUMERICS: "red", Verdict.NOT_CONFIRMED: "yellow", Verdict.FAILED: "red", Verdict.TIMEOUT: "red",
    Verdict.SKIPPED: "dim", Verdict.NOT_APPLIED: "dim", Verdict.NOT_RUN: "dim",
}


class RichProgress:
    """One line per finished trial, and a spinner with the running trial's name and time limit."""

    def __init__(self, out: Console | None = None) -> None:
        self.console = out or default_console()
        self._status: Any = None
        self._n = 0

    def message(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/]")

    def trial_started(self, label: str, limit_s: float) -> None:
        self._n += 1
        if self.console.is_terminal:
            self._status = self.console.status(f"trial {self._n}: {label} (limit {limit_s:.0f} s)")
            self._status.start()

    def trial_finished(self, result: TrialResult) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if result.ok and result.status == TrialStatus.OK:
            info = f"{result.median_ms:.1f} ms/step"
        else:
            info = f"[red]{result.status}[/]: {result.cause}"
        self.console.print(f"  trial {self._n}: [bold]{result.label}[/] {info} [dim]({result.wall_s:.0f} s)[/]")


def fmt_speedup(value: float | None) -> str:
    """``1.35x`` or ``-``."""
    return f"{value:.2f}x" if value else "-"


def fmt_ms(value: float | None) -> str:
    """Milliseconds with one decimal, or ``-``."""
    return f"{value:.1f}" if value is not None else "-"


def row_cells(trial: TrialResult) -> list[str]:
    """Cells of one ranked-table row (shared with the HTML report)."""
    compile_ms = trial.compile.get("compile_ms") if trial.compile else None
    dev = "-" if trial.deviation is None else f"{trial.deviation:.1e}"
    why = trial.note or trial.cause
    return [
        trial.label,
        fmt_ms(trial.median_ms),
        fmt_speedup(trial.speedup) if trial.verdict != Verdict.BASELINE else "1.00x",
        f"{compile_ms / 1000:.1f} s" if compile_ms else "-",
        fmt_bytes(trial.peak_bytes) if trial.peak_bytes else "-",
        dev,
        str(trial.verdict),
        why,
    ]


HEADERS = ["variant", "step ms", "speedup", "compile", "peak mem", "loss dev", "verdict", "why"]


FEW_PAIRS = 3
"""Below this many confirmation pairs the recommendation carries a re-measure note."""


def print_tune_result(result: TuneResult, *, out_dir: Any, config_path: Any, out: Console | None = None) -> None:
    """The ranked table, the recommendation (or why there is none), the code lines and where files are."""
    c = out or default_console()
    if not c.is_terminal:  # logs and pipes: wide enough that the table does not fold every cell
        c.width = max(c.width, 160)
    table = Table(title="scalpel tune: variants ranked by median step time", title_justify="left")
    for i, h in enumerate(HEADERS):
        table.add_column(h, justify="right" if 0 < i < 6 else "left", overflow="fold",
                         no_wrap=i < 7, ratio=1 if i == 7 else None)
    for trial in result.ranked():
        table.add_row(*row_cells(trial), style=VERDICT_STYLE.get(trial.verdict, ""))
    c.print(table)
    if result.winner is not None:
        pairs = len(result.winner.confirm_ratios or [])
        c.print(f"[bold green]recommended:[/] {result.winner.label}: {fmt_speedup(result.confirmed_speedup)} "
                f"faster per step than the baseline in {pairs} interleaved pair{'s' if pairs != 1 else ''} "
                f"(needed {result.required:.2f}x)")
        if pairs < FEW_PAIRS:
            # Seen on a shared GPU: one pair said 1.59x, an independent 2-round re-measure 1.07x.
            c.print(f"[yellow]note:[/] {pairs} pair{'s' if pairs != 1 else ''} can overstate the gain on a busy machine; "
                    f"re-measure with --confirm {FEW_PAIRS} before quoting the figure.")
        from torchscalpel.tune.apply import code_lines

        c.print("[bold]equivalent code[/] (if you prefer to edit the script):")
        for line in code_lines(result.settings):
            c.print(f"    {line}", markup=False, highlight=False)
        c.print(f"settings: [bold]{config_path}[/]  ->  scalpel run --config {config_path} -- SCRIPT ...")
    else:
        c.print("[bold yellow]no change recommended:[/] nothing beat the baseline reliably with numerics intact.")
    for note in result.notes:
        c.print(f"[dim]note: {note}[/]")
    c.print(f"report: [bold]{out_dir}/report.html[/]  record: {out_dir}/run.json  trials: {out_dir}/trials/")

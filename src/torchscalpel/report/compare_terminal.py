"""The terminal view of a :class:`~torchscalpel.compare.core.Comparison` (rich tables on stdout)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape as markup_escape
from rich.table import Table

from torchscalpel.compare.core import Comparison
from torchscalpel.console import make_console
from torchscalpel.record import PHASES
from torchscalpel.report.names import clip
from torchscalpel.units import fmt_bytes


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _noise(value: float | None) -> str:
    return "" if value is None else f" ±{value:.0%}"


def step_table(cmp: Comparison) -> Table:
    """Median step time (with each run's noise) and each phase's median, one column per run."""
    t = Table(title="per step (median over measured steps, ± median absolute deviation)")
    t.add_column("ms")
    for r in cmp.runs:
        t.add_column(f"{r.label}", justify="right")
    t.add_row("step", *[_ms(r.facts.median_step_ms) + _noise(r.facts.noise) for r in cmp.runs])
    for phase in PHASES:
        cells = []
        for r in cmp.runs:
            v = r.facts.phase_median_ms.get(phase)
            n = r.facts.phase_noise.get(phase)
            cells.append(_ms(v) + ("" if n is None else f" ±{n:.2f}"))
        t.add_row(phase, *cells)
    t.add_row("steps", *[str(r.facts.steps) for r in cmp.runs])
    return t


def figure_rows(cmp: Comparison) -> list[tuple[str, list[str]]]:
    """Memory peaks and throughput as (readable name, one cell per run), rows only where some run
    recorded them; the terminal and the HTML page show the same rows."""
    rows: list[tuple[str, list[str]]] = []
    for key in ("allocator_peak", "cuda_allocated_peak", "cuda_reserved_peak", "rss_peak"):
        if any(key in r.facts.memory for r in cmp.runs):
            rows.append(
                (
                    key.replace("_", " "),
                    [fmt_bytes(r.facts.memory[key]) if key in r.facts.memory else "-" for r in cmp.runs],
                )
            )
    fmt: dict[str, Any] = {
        "samples_per_s": lambda v: f"{v:,.1f}",
        "steps_per_s": lambda v: f"{v:.2f}",
        "flops_per_s": lambda v: f"{v / 1e9:.2f} G",
        "mfu": lambda v: f"{v:.1%}",
    }
    for key, f in fmt.items():
        if any(key in r.facts.throughput for r in cmp.runs):
            rows.append(
                (
                    key.replace("_per_s", "/s").replace("_", " "),
                    [f(r.facts.throughput[key]) if key in r.facts.throughput else "-" for r in cmp.runs],
                )
            )
    return rows


def figures_table(cmp: Comparison) -> Table | None:
    """Memory peaks and throughput, rows only where some run recorded them."""
    rows = figure_rows(cmp)
    if not rows:
        return None
    t = Table(title="memory and throughput")
    t.add_column("")
    for r in cmp.runs:
        t.add_column(r.label, justify="right")
    for name, cells in rows:
        t.add_row(name, *cells)
    return t


def render(cmp: Comparison, console: Console | None = None) -> None:
    """Runs, the step table, memory/throughput, then per pair its losses, differences and verdict."""
    # make_console: in a pipe 200 columns (COLUMNS when set) and soft wrap, so a log line is never cut at
    # rich's default 80 (the README's tour); on a terminal its width
    out = console or make_console(highlight=False)
    for r in cmp.runs:
        out.print(
            f"[bold]{r.label}[/bold] "
            + markup_escape(  # a name like "[/bold]" is text, not rich markup
                f"{clip(r.path)} ({clip(r.record.name)}, {clip(r.record.created) or 'no date'}, "
                f"schema {clip(r.record.schema_version)})"
            )
        )
    out.print(step_table(cmp))
    figures = figures_table(cmp)
    if figures is not None:
        out.print(figures)
    for pair in cmp.pairs:
        if pair.differences:
            t = Table(title=f"{pair.a.label} vs {pair.b.label}: recorded differences")
            for col in ("kind", "what", pair.a.label, pair.b.label):
                # a value too long for its cell (a path, a version string) is folded, never cut to "…"
                t.add_column(col, overflow="fold")
            for d in pair.differences:
                a, b = d.phrase().removeprefix(d.key + " ").split(" -> ", 1)
                t.add_row(d.kind if d.ran else f"{d.kind} (no file that ran)", d.key, a, b)
            out.print(t)
    for note in cmp.notes:
        out.print(f"[yellow]note:[/yellow] {note}")
    for pair in cmp.pairs:
        # wrapped between words on a terminal (the console's width); one line in a pipe (soft wrap there)
        out.print(f"[bold]verdict {pair.a.label} -> {pair.b.label}:[/bold] {pair.verdict}")

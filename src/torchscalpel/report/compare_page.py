"""The HTML report of a comparison: one self-contained page (inline SVG, no scripts, opens offline),
built from :func:`torchscalpel.report.html.render_page` and the shared chart helpers."""

from __future__ import annotations

from html import escape
from pathlib import Path

from torchscalpel.compare.core import Comparison
from torchscalpel.fileio import atomic_write_text
from torchscalpel.record import PHASES
from torchscalpel.report import charts
from torchscalpel.report.compare_terminal import figure_rows
from torchscalpel.report.html import render_page
from torchscalpel.report.names import clip
from torchscalpel.report.page import Section, table


def _curve(values: list[float | None], n: int) -> list[float | None]:
    return list(values) + [None] * (n - len(values))


STACK_GAP = 0.05
"""A run whose stacked phase medians differ from its median step by more than this share gets a note."""


def _stack_note(cmp: Comparison) -> str:
    """Medians do not add up: say so where the stacked phase medians and the median step differ visibly."""
    off = []
    for r in cmp.runs:
        total, stacked = r.facts.median_step_ms, sum(r.facts.phase_median_ms.values())
        if total and abs(stacked - total) > STACK_GAP * total:
            off.append(f"{r.label}: {stacked:.2f} ms stacked, {total:.2f} ms median step")
    if not off:
        return ""
    return (
        "<p>Each bar stacks the phases' medians, which need not add up to the median step when steps vary ("
        + escape("; ".join(off))
        + ").</p>"
    )


def sections(cmp: Comparison) -> list[Section]:
    """Verdicts, step time and phases, the overlaid curves, memory and throughput, differences, notes."""
    out = [
        Section(
            id="verdict",
            title="Verdict",
            body="".join(
                f"<p><b>{escape(p.a.label)} → {escape(p.b.label)}</b>: {escape(p.verdict)}</p>"
                for p in cmp.pairs
            )
            + table(
                ["run", "path", "name", "created", "schema"],
                [
                    (
                        r.label,
                        clip(r.path),
                        clip(r.record.name),
                        clip(r.record.created),
                        clip(r.record.schema_version),
                    )
                    for r in cmp.runs
                ],
            ),
        )
    ]
    rows = [
        [
            "step",
            *[
                f"{r.facts.median_step_ms:.2f} ±{(r.facts.noise or 0):.0%}" if r.facts.median_step_ms else "-"
                for r in cmp.runs
            ],
        ]
    ]
    for phase in PHASES:
        rows.append(
            [
                phase,
                *[
                    f"{r.facts.phase_median_ms[phase]:.2f}" if phase in r.facts.phase_median_ms else "-"
                    for r in cmp.runs
                ],
            ]
        )
    # The chart plots the table's statistic (each phase's median), so a bar's segment is its table cell.
    bars = charts.stacked_bars(
        "compare-phases",
        [r.label for r in cmp.runs],
        {p: [r.facts.phase_median_ms.get(p, 0.0) for r in cmp.runs] for p in PHASES},
        x_title="run",
        y_title="median per phase (ms)",
    )
    out.append(
        Section(
            id="steps",
            title="Step time and phases (median ms, ± noise)",
            body=table(["", *[r.label for r in cmp.runs]], rows, [False] + [True] * len(cmp.runs))
            + bars
            + _stack_note(cmp),
        )
    )
    n = max(len(r.facts.step_ms) for r in cmp.runs)
    xs = list(range(n))
    # Warm-up steps (compilation, first-batch effects) would flatten the rest of the curve: left out.
    measured = {
        r.label: _curve([None if s.warmup else s.total_ms for s in r.record.steps], n) for r in cmp.runs
    }
    out.append(
        Section(
            id="step-curves",
            title="Step time per measured step (overlaid)",
            body=charts.lines(
                "compare-steps",
                xs,
                measured,
                unit="ms",
                x_title="step (index in each run)",
                y_title="step time (ms)",
            ),
        )
    )
    if any(v is not None for r in cmp.runs for v in r.facts.losses):
        match = "".join(
            f"<p>{escape(p.a.label)} vs {escape(p.b.label)}: "
            + escape(
                "bit-identical"
                if p.losses.identical
                else f"first differ at step {p.losses.first_diff_step}, max |diff| "
                f"{(p.losses.max_abs_diff or 0):.3g}"
                if p.losses.compared
                else "no common steps"
            )
            + f" ({p.losses.compared} steps compared)</p>"
            for p in cmp.pairs
        )
        out.append(
            Section(
                id="loss",
                title="Loss curves (overlaid)",
                body=charts.lines(
                    "compare-loss",
                    xs,
                    {r.label: _curve(r.facts.losses, n) for r in cmp.runs},
                    x_title="step (index in each run)",
                    y_title="loss",
                )
                + match,
            )
        )
    # readable names and units, as the terminal shows them (raw keys and 4.377e+09 were shown here)
    fig_rows = [[name, *cells] for name, cells in figure_rows(cmp)]
    if fig_rows:
        out.append(
            Section(
                id="figures",
                title="Memory peaks and throughput",
                body=table(["", *[r.label for r in cmp.runs]], fig_rows, [False] + [True] * len(cmp.runs)),
            )
        )
    diff_rows = [
        (
            f"{p.a.label} vs {p.b.label}",
            d.kind if d.ran else f"{d.kind} (no file that ran)",
            d.key,
            *d.phrase().removeprefix(d.key + " ").split(" -> ", 1),
        )
        for p in cmp.pairs
        for d in p.differences
    ]
    out.append(
        Section(
            id="differences",
            title="Recorded differences",
            body=table(["pair", "kind", "what", "before", "after"], diff_rows)
            if diff_rows
            else "<p>None recorded.</p>",
        )
    )
    if cmp.notes:
        out.append(Section(id="notes", title="Notes", body="".join(f"<p>{escape(n)}</p>" for n in cmp.notes)))
    return out


def render(cmp: Comparison) -> str:
    """The whole page."""
    subtitle = " vs ".join(f"{r.label}: {clip(r.record.name)}" for r in cmp.runs)
    return render_page("torchscalpel compare", subtitle, sections(cmp))


def write_html(cmp: Comparison, path: Path) -> Path:
    """Write the page atomically; return its path."""
    atomic_write_text(path, render(cmp))
    return path

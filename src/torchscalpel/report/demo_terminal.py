"""The demo's closing table on the terminal: each stage's result, time and one line, then the report."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class StageLine(Protocol):
    """What the table reads of one demo stage (``stages.demo.StageResult``, a floor above this one)."""

    name: str
    ok: bool
    seconds: float
    summary: str


def result_word(stage: StageLine) -> str:
    """``ok``, ``FAILED`` or ``skipped``: one word per stage, the same in the table and the combined page."""
    return "FAILED" if not stage.ok else "skipped" if stage.summary.startswith("skipped") else "ok"


def render(stages: Sequence[StageLine], report: Path) -> None:
    """The closing table: each stage's result, time and summary, then where the report is."""
    from rich.markup import escape

    from torchscalpel.console import console, rule

    c = console()
    rule(c, "[bold]demo summary[/]")
    for r in stages:
        mark = {"FAILED": "[red]FAILED[/]", "skipped": "[yellow]skipped[/]"}.get(
            result_word(r), "[green]ok[/]"
        )
        c.print(f"{mark} {r.name:<8} {r.seconds:6.1f} s  {escape(r.summary)}")
    c.print(f"\nOpen the report: [bold]{escape(str(report))}[/]")

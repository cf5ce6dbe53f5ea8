"""Rendering findings: the ranked terminal view (rich) and the JSON document. Nothing here measures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.syntax import Syntax

from torchscalpel.console import fit_code
from torchscalpel.doctor.registry import rank_findings
from torchscalpel.findings import Finding, Severity, counts, short_path

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold yellow", Severity.INFO: "cyan"}


def render(
    findings: Sequence[Finding],
    console: Console | None = None,
    *,
    header: str = "",
    not_analysed: Sequence[Any] = (),
    keep_order: bool = False,
) -> None:
    """Print findings most severe first (``keep_order``: in the order given): slug, message, evidence,
    location and the fix as code; files the static rules could not analyse (``not_analysed``, e.g. a
    syntax error and its line) first."""
    if console is None:
        from torchscalpel.console import make_console

        console = make_console()  # full width when piped: messages and fixes are never cut
    ranked = list(findings) if keep_order else rank_findings(findings)
    if header:
        console.print(header)
    for entry in not_analysed:
        console.print(f"[bold yellow]NOT ANALYSED[/] {escape(str(entry))}")
    if not ranked:
        console.print(
            "[green]No findings in the files that could be analysed.[/green]"
            if not_analysed
            else "[green]No findings.[/green]"
        )
        return
    for f in ranked:
        sev = f.severity
        where = f" [dim]{escape(short_path(str(f.location)))}[/dim]" if f.location else ""
        rank = f" [dim](rank {f.rank})[/dim]" if f.rank is not None else ""
        console.print(f"[{_STYLE[sev]}]{str(sev).upper():7}[/] [bold]{escape(f.rule)}[/bold]{where}{rank}")
        console.print(f"  {escape(f.message)}")
        for line in f.evidence:
            console.print(f"  [dim]-[/dim] {escape(line)}")
        if f.fix:
            console.print("  [green]fix:[/green]")
            # re-laid to the width (comments above, breaks inside brackets) so that it still parses; rich's
            # word wrap cut a long line anywhere. As wide as the code (no trailing blanks in a log).
            fix = f.fix if console.soft_wrap else fit_code(f.fix, max(20, console.width - 8))
            code_width = min(max(len(line) for line in fix.splitlines() or [""]), max(20, console.width - 8))
            console.print(
                Padding(
                    Syntax(
                        fix,
                        "python",
                        theme="ansi_dark",
                        background_color="default",
                        word_wrap=True,
                        code_width=code_width,
                    ),
                    (0, 0, 0, 4),
                    expand=False,
                )
            )
        console.print()
    console.print(summary_line(ranked))


def render_rank_findings(
    across: Sequence[Finding], per_rank: Sequence[Finding], console: Console, *, ranks: int, header: str = ""
) -> None:
    """A multi-rank doctor's findings (``scalpel launch --doctor``, ``scalpel doctor --nproc``): those
    found by comparing the ranks, then each rank's own (merged), each group under a line that says which
    it is; one "No findings." only when neither group has any."""
    if header:
        console.print(header)
    if not across and not per_rank:
        console.print(f"[green]No findings[/green] on any of the {ranks} rank(s), nor across them.")
        return
    if across:
        render(
            across,
            console,
            keep_order=True,  # the hang watch's first: they explain the rest
            header=f"[bold]across ranks[/bold] (the launcher compared the {ranks} ranks):",
        )
    else:
        console.print(f"[bold]across ranks[/bold]: none (the launcher compared the {ranks} ranks)")
    console.print()
    if per_rank:
        render(per_rank, console, header="[bold]per rank[/bold] (each rank's own doctor, merged):")
    else:
        console.print("[bold]per rank[/bold]: none (each rank's own doctor)")


def summary_line(findings: Sequence[Finding]) -> str:
    """The closing line: counts per severity, and in words when errors were found (the run is wrong)."""
    c = counts(findings)
    line = f"[bold]{len(findings)} finding(s):[/bold] {c['error']} error, {c['warning']} warning, {c['info']} info"
    if c["error"]:
        line += (
            f" - [bold red]{c['error']} error(s) found[/]: training or its results are broken until "
            f"{'it is' if c['error'] == 1 else 'they are'} fixed"
        )
    elif not c["warning"]:
        line += " - no errors or warnings"
    return line


def to_json(findings: Sequence[Finding], **meta: Any) -> dict[str, Any]:
    """The ``--json`` document: ``findings`` (each with its ``rule`` slug), ``counts`` and run metadata."""
    ranked = rank_findings(findings)
    return {
        "tool": "torchscalpel-doctor",
        **meta,
        "counts": counts(ranked),
        "findings": [f.to_dict() for f in ranked],
    }


def reaches(findings: Sequence[Finding], level: Severity | None) -> bool:
    """True when some finding is at least ``level`` (``--fail-on``)."""
    return level is not None and any(f.severity >= level for f in findings)

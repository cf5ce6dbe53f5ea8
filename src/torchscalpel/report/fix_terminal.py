"""What ``scalpel fix`` prints after the diff: each item's fate, the hand-made snippets, the verdict."""

from __future__ import annotations

from torchscalpel.console import fit_code
from torchscalpel.fix.diff import printable
from torchscalpel.fix.stage import FixResult

SNIPPET_WIDTH = 76
"""A snippet's lines are printed four columns in, re-laid to fit 80 (``fit_code``: still valid Python)."""


def render(result: FixResult) -> list[str]:
    """One line per planned change (patched / already / not patched + reason and snippet), then
    what was written and the verification."""
    out: list[str] = []
    for item in result.items:
        where = f" ({item.where})" if item.where else ""
        if item.status == "not patched":
            out.append(f"not patched: {item.label}: {item.reason}; by hand:")
            # the whole snippet, re-laid to the width and never cut: a copy of it must parse
            out.extend(f"    {line}" for line in fit_code(item.snippet, SNIPPET_WIDTH).splitlines() or ["-"])
        elif item.status == "already":
            out.append(f"already done: {item.label}{where}")
        else:
            out.append(f"patched: {item.label}{where}")
    if not result.items:
        out.append(
            "nothing to fix: the runs kept no tune setting, crossed no memory limit and found nothing fix edits"
        )
    elif not result.changes and any(i.status == "not patched" for i in result.items):
        out.append("no diff: what the runs asked for is not patched (the reasons above)")
    elif not result.changes:
        out.append("no diff: the code already does everything fix can place")
    if result.applied:
        out.append(f"applied to {len(result.changes)} file(s) under {result.root}")
    elif result.changes:
        out.append("nothing written to your files (--apply writes them)")
    if result.verification is not None:
        out.extend(f"verify: {line}" for line in result.verification.lines())
    # Reasons and snippets quote a record's strings (a library's name, a finding's fix): shown, never a
    # terminal control sequence.
    return [printable(line) for line in out]

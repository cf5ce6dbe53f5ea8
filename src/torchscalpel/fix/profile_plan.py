"""A profile run's findings as edits: each ``unfused-attention`` finding (hand-written attention the
op-line pass saw, :mod:`torchscalpel.trace.patterns`) becomes an ``sdpa`` edit at its line
(:mod:`torchscalpel.fix.editors.attention` rewrites the code there). Like the other planners, nothing
here reads the user's files.
"""

from __future__ import annotations

from pathlib import Path

from torchscalpel.fix.cst import Edit
from torchscalpel.fix.planned import Planned
from torchscalpel.record import RunRecord

RULE = "unfused-attention"
KIND = "sdpa"


def attention_plan(record: RunRecord) -> list[Planned]:
    """An ``sdpa`` edit at each ``unfused-attention`` finding of a profile run, at its line; attention in
    an installed package (transformers' eager attention) is refused: fix edits only the user's files."""
    out: list[Planned] = []
    for finding in record.findings:
        if finding.get("rule") != RULE:
            continue
        where = finding.get("location")
        where = where if isinstance(where, dict) else {}
        snippet = str(finding.get("fix") or "")
        line = where.get("line")
        # a record is data: a line that is not a positive whole number names no line
        if (
            not isinstance(where.get("file"), str)
            or not isinstance(line, int)
            or isinstance(line, bool)
            or line <= 0
        ):
            out.append(Planned(RULE, "profile", None, None, snippet, "the finding names no line", rule=RULE))
        elif "(library code)" in str(finding.get("message") or ""):
            reason = "the attention is an installed package's code, which fix does not edit; switch it by its own option"
            out.append(Planned(RULE, "profile", None, None, snippet, reason, rule=RULE))
        else:
            out.append(
                Planned(RULE, "profile", Path(where["file"]), Edit(kind=KIND, line=line), snippet, rule=RULE)
            )
    return out

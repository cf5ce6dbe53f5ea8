"""The rule table by slug: every doctor rule's stable slug, default severity, category and one-line
summary (:data:`RULES`), and the order findings are ranked in (:func:`rank_findings`).

It sits above :mod:`torchscalpel.doctor.catalogue` (the one list of rule classes, which derives
:data:`RULES`); no rule imports it: a rule builds its findings from its own
:class:`~torchscalpel.doctor.rule.RuleInfo` (:meth:`~torchscalpel.doctor.rule.RuleInfo.finding`).
The slugs are a contract (JSON and SARIF carry them as ``rule``); add rules, never rename them.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchscalpel.doctor.catalogue import RULES as RULES
from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.findings import Finding


def rule_info(slug: str) -> RuleInfo:
    """The :class:`RuleInfo` of ``slug`` (KeyError for an unknown slug: a programming error)."""
    return RULES[slug]


def rank_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Findings ordered most severe first, then by rule order in :data:`RULES`, then location."""
    order = {slug: i for i, slug in enumerate(RULES)}

    def key(f: Finding) -> tuple[int, int, str, int]:
        loc = f.location
        return (
            -int(f.severity),
            order.get(f.rule, len(order)),
            loc.file if loc else "",
            loc.line if loc else 0,
        )

    return sorted(findings, key=key)

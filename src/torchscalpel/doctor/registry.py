"""The rule registry: every doctor rule's stable slug, default severity, category and one-line summary.

:data:`RULES` is derived from the rule classes listed in :mod:`torchscalpel.doctor.catalogue` (each
class declares its :class:`RuleInfo`). The slugs are a contract (JSON and SARIF carry them as
``rule``); add rules, never rename them.
:func:`guarded` runs one rule's code so that a crash becomes that rule's internal-error finding
instead of ending the run or silencing the other rules.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.findings import Finding, Location, Severity

if TYPE_CHECKING:
    RULES: dict[str, RuleInfo]
    """All rules by slug, in documentation order (derived from :mod:`torchscalpel.doctor.catalogue`)."""


def __getattr__(name: str) -> Any:
    # RULES is derived from the rule classes (torchscalpel.doctor.catalogue), which import this module
    # for make_finding: resolved on first use instead of at import, so there is no import cycle.
    if name == "RULES":
        from torchscalpel.doctor.catalogue import RULES

        return RULES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rules() -> dict[str, RuleInfo]:
    from torchscalpel.doctor.catalogue import RULES

    return RULES


def rule_info(slug: str) -> RuleInfo:
    """The :class:`RuleInfo` of ``slug`` (KeyError for an unknown slug: a programming error)."""
    return _rules()[slug]


def make_finding(
    slug: str,
    message: str,
    *,
    evidence: Iterable[str] = (),
    fix: str = "",
    location: Location | None = None,
    source: str = "runtime",
    severity: Severity | None = None,
) -> Finding:
    """A :class:`Finding` for registered rule ``slug`` with its default severity unless overridden."""
    info = _rules()[slug]
    return Finding(
        rule=slug,
        severity=info.severity if severity is None else severity,
        message=message,
        evidence=list(evidence),
        fix=fix,
        location=location,
        source=source,
    )


def internal_error(slug: str, exc: BaseException, *, source: str = "runtime") -> Finding:
    """The finding that stands in for rule ``slug`` when its own code crashed (severity info)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "unknown"
    return Finding(
        rule=slug,
        severity=Severity.INFO,
        message=f"internal error in rule {slug}: {type(exc).__name__}: {exc}"[:300],
        evidence=[f"raised at {where}", "the other rules still ran; please report this with the script"],
        fix="",
        source=source,
    )


T = TypeVar("T")


def guarded(slug: str, fn: Callable[[], Iterable[Finding]], *, source: str) -> list[Finding]:
    """Run ``fn`` (one rule's check); a crash becomes that rule's internal-error finding."""
    try:
        return list(fn())
    except Exception as exc:  # a broken rule must never cost the user the other findings
        return [internal_error(slug, exc, source=source)]


def rank_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Findings ordered most severe first, then by rule order in :data:`RULES`, then location."""
    order = {slug: i for i, slug in enumerate(_rules())}

    def key(f: Finding) -> tuple[int, int, str, int]:
        loc = f.location
        return (
            -int(f.severity),
            order.get(f.rule, len(order)),
            loc.file if loc else "",
            loc.line if loc else 0,
        )

    return sorted(findings, key=key)

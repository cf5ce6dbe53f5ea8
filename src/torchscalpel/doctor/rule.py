"""What every doctor rule class declares: its :class:`RuleInfo` (slug, severity, category, summary,
kinds) and which other rules its findings make redundant; how a rule builds its findings
(:meth:`RuleInfo.finding`) and how a crash in a rule's code becomes its internal-error finding
(:func:`guarded`, :func:`internal_error`).

Static rules (:class:`torchscalpel.doctor.static.StaticRule`) and runtime rules
(:class:`torchscalpel.doctor.runtime_rules.RuntimeRule`) share this base; the one list of rule
classes is :mod:`torchscalpel.doctor.catalogue`, and :data:`torchscalpel.doctor.registry.RULES`
is derived from it. This is the bottom of the doctor: it imports no other doctor module, and a rule
never looks its own metadata up by slug (the catalogue sits above the rules and only collects them).
Nothing here registers anything: importing a rule module has no side effect.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from torchscalpel.findings import Finding, Location, Severity


@dataclass(frozen=True, slots=True)
class RuleInfo:
    """What every rule declares: slug, default severity, category and a one-line summary."""

    slug: str
    severity: Severity
    category: str
    summary: str
    kinds: tuple[str, ...]
    """``static`` and/or ``runtime``: where the rule looks."""

    def finding(
        self,
        message: str,
        *,
        evidence: Iterable[str] = (),
        fix: str = "",
        location: Location | None = None,
        source: str = "runtime",
        severity: Severity | None = None,
    ) -> Finding:
        """A :class:`Finding` of this rule, at its default severity unless ``severity`` overrides it."""
        return Finding(
            rule=self.slug,
            severity=self.severity if severity is None else severity,
            message=message,
            evidence=list(evidence),
            fix=fix,
            location=location,
            source=source,
        )


class Rule:
    """Base of every rule class.

    A class that reports one slug sets :attr:`info`; one that reports several sets :attr:`infos`.
    A slug checked both statically and at runtime has one :class:`RuleInfo` object, written on one
    class and referenced by the other (the catalogue test checks it is the same object).
    """

    info: ClassVar[RuleInfo | None] = None
    infos: ClassVar[tuple[RuleInfo, ...]] = ()
    """The rules this class reports, in the order it reports them."""
    slugs: ClassVar[tuple[str, ...]] = ()
    """The slugs of :attr:`infos` (derived; helper observers that report nothing leave it empty)."""
    supersedes: ClassVar[tuple[str, ...]] = ()
    """Slugs whose findings a finding of this class's own slugs makes redundant (the same cause,
    explained better): see :meth:`redundant`."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("info") is not None:
            cls.infos = (cls.__dict__["info"],)
        if "info" in cls.__dict__ or "infos" in cls.__dict__:
            cls.slugs = tuple(i.slug for i in cls.infos)

    @classmethod
    def redundant(cls, findings: Sequence[Finding]) -> list[Finding]:
        """The findings among ``findings`` that this rule's own findings make redundant.

        Default: when a finding of one of :attr:`slugs` is present, every finding of a slug in
        :attr:`supersedes`. A rule whose condition is narrower overrides this.
        """
        if not cls.supersedes or not any(f.rule in cls.slugs for f in findings):
            return []
        return [f for f in findings if f.rule in cls.supersedes]


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


def guarded(slug: str, fn: Callable[[], Iterable[Finding]], *, source: str) -> list[Finding]:
    """Run ``fn`` (one rule's check); a crash becomes that rule's internal-error finding."""
    try:
        return list(fn())
    except Exception as exc:  # a broken rule must never cost the user the other findings
        return [internal_error(slug, exc, source=source)]

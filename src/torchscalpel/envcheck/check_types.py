"""What every environment check is: a pure function of the facts dict that returns findings (source ``env``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchscalpel.findings import Finding, Severity

Facts = dict[str, Any]
CheckFn = Callable[[Facts], list[Finding]]


def env_finding(rule: str, severity: Severity, message: str, evidence: list[str], fix: str) -> Finding:
    """A finding of ``scalpel env`` (and of doctor's environment checks)."""
    return Finding(rule=rule, severity=severity, message=message, evidence=evidence, fix=fix, source="env")

"""The states of a tune trial: its run status and the search's verdict, each spelled once.

Both are ``str`` enums (``class X(str, Enum)``, since ``StrEnum`` is Python 3.11+): a member
compares equal to its value and is written to JSON as that value, so ``sections["tune"]`` holds
the same strings as before. ``parse`` reads a stored value back, including the spellings of
records written before the states were typed (``not-applied`` / ``not-run`` statuses).
"""

from __future__ import annotations

import enum


class _State(str, enum.Enum):
    """A ``str`` enum that prints and formats as its value (``f"{x}"`` is ``"ok"``, on 3.10-3.13)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class TrialStatus(_State):
    """How a trial's process ended (set by the runner, or by the search for trials it did not run)."""

    OK = "ok"
    FAILED = "failed"
    """Crash, out of memory, compile error, or no measured step."""
    TIMEOUT = "timeout"
    """Stopped at its share of the budget."""
    NOT_APPLIED = "not applied"
    """Ran, but the knob found nothing to change."""
    SKIPPED = "skipped"
    """Not run: the knob cannot apply to this script."""
    NOT_RUN = "not run"
    """Not run: the budget ran out first."""

    @classmethod
    def parse(cls, value: str) -> TrialStatus:
        """The status for a stored value; older records spelled two of them ``not-applied`` and ``not-run``."""
        return cls(_LEGACY_STATUS.get(value, value))


_LEGACY_STATUS = {"not-applied": "not applied", "not-run": "not run"}
"""Status spellings of records written before the states were typed."""


class Verdict(_State):
    """What the search concluded about a trial (the ``verdict`` column)."""

    UNJUDGED = ""
    """Not judged yet (a trial result fresh from the runner)."""
    BASELINE = "baseline"
    WINNER = "winner"
    """Recommended: won screening and the interleaved confirmation."""
    NOT_CONFIRMED = "not confirmed"
    """Won screening, lost the interleaved pairs."""
    FASTER = "faster"
    """Won screening (faster by the margin, numerics gate passed)."""
    NOT_FASTER = "not faster"
    NUMERICS = "numerics"
    """Failed the numerics gate."""
    FAILED = "failed"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"
    NOT_APPLIED = "not applied"
    NOT_RUN = "not run"

    @classmethod
    def parse(cls, value: str) -> Verdict:
        """The verdict for a stored value."""
        return cls(value)


__all__ = ["TrialStatus", "Verdict"]

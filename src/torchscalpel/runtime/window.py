"""The run window every script-running stage shares: how many steps, and what a step is.

One grammar for ``--steps`` across profile, doctor, tune and launch: a number, ``all`` (until
the script ends) or ``auto`` (the stage's own default, documented by each stage). Kept free of
torch so the CLI can validate flags before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torchscalpel.errors import ArgumentError, literal
from torchscalpel.options import PROFILE_EVENT_BUDGET, STEP_TIMEOUT_S, StageOptions
from torchscalpel.units import NumberError, parse_int

StepCount = int | Literal["all", "auto"]
"""A parsed ``--steps``: a count of measured steps, ``"all"`` or ``"auto"``."""

STEP_KINDS = ("auto", "optimizer", "backward", "forward")
"""What delimits a step: ``auto`` (the strongest boundary seen) or one fixed kind."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepWindow(StageOptions):
    """A run window: warm-up, measured steps, what a step is, how long to wait for one, and the profiler's
    share. The one source of these numbers: each stage's instance (:data:`PROFILE_WINDOW`,
    :data:`MEMORY_WINDOW`, ``doctor.window.DOCTOR_WINDOW``) gives the CLI's flag defaults (``--warmup``,
    ``--steps auto``, ``--profile-steps``, ``--step-timeout``, ``--profile-budget``) and the in-process API's
    argument defaults; every options class that runs a script takes its defaults from one. Validated on
    construction (:func:`check_window`)."""

    warmup: int
    """Steps run before measuring."""
    steps: int | None
    """Measured steps of the default window (``--steps auto``); None: until the script ends."""
    profile_steps: int = 0
    """Steps inside the torch.profiler window (profile only)."""
    step_kind: str = "auto"
    """What delimits a step (:data:`STEP_KINDS`)."""
    step_timeout_s: float | None = STEP_TIMEOUT_S
    """Stop the script when no step has ended this long after its loop started (None: wait forever)."""
    profile_event_budget: int | None = PROFILE_EVENT_BUDGET
    """Trace events the profiler window may hold (None: no limit)."""

    def __post_init__(self) -> None:
        check_window(
            warmup=self.warmup,
            steps=self.steps,
            profile_steps=self.profile_steps,
            step_kind=self.step_kind,
            step_timeout_s=self.step_timeout_s,
            profile_event_budget=self.profile_event_budget,
        )


def check_warmup(value: object) -> int:
    """The one warm-up check, for the CLI flag, the ``scalpel.toml`` key and the in-process argument:
    an integer >= 0 (not a bool); an :class:`~torchscalpel.errors.ArgumentError` naming ``warmup``
    otherwise (the CLI words it ``--warmup``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentError("{warmup} must be an integer >= 0, not " + literal(repr(value)))
    return value


def parse_steps(text: str | int, *, minimum: int = 1) -> StepCount:
    """``--steps``: ``N`` (at least ``minimum``, below 2^63: the shared number rule,
    :func:`torchscalpel.units.parse_int`), ``all`` or ``auto``; ValueError naming the flag otherwise."""
    word = str(text).strip().lower()
    if word in ("all", "auto"):
        return "all" if word == "all" else "auto"
    if not word.lstrip("+-").isdigit():
        raise ValueError(f"--steps takes a number, 'all' or 'auto', not {text!r}")
    try:
        return parse_int(word, flag="--steps", minimum=minimum, also="'all' / 'auto'")
    except NumberError as exc:  # this function's callers (the CLI, scalpel.toml's check) take ValueError
        raise ValueError(str(exc).rstrip(".")) from None


def check_window(
    *,
    warmup: int,
    steps: int | None,
    profile_steps: int = 0,
    step_kind: str = "auto",
    step_timeout_s: float | None = None,
    profile_event_budget: int | None = None,
) -> None:
    """The checks every run window passes: an :class:`~torchscalpel.errors.ArgumentError` whose sentence
    names the argument (``steps must be at least 1``), which the CLI words with its flag (``--steps``)."""
    check_warmup(warmup)
    if steps is not None and steps < 1:
        raise ArgumentError("{steps} must be at least 1, or 'all'")
    if profile_steps < 0:
        raise ArgumentError("{profile_steps} must be 0 or more")
    if step_kind not in STEP_KINDS:
        raise ArgumentError("{step_kind} must be one of " + ", ".join(STEP_KINDS))
    if step_timeout_s is not None and step_timeout_s <= 0:
        raise ArgumentError("{step_timeout_s} must be more than 0 seconds")
    if profile_event_budget is not None and profile_event_budget < 1:
        raise ArgumentError(
            "{profile_event_budget} must be at least 1 event, got " + literal(profile_event_budget)
        )


PROFILE_WINDOW = StepWindow(warmup=2, steps=20, profile_steps=3)
"""``scalpel profile`` / ``torchscalpel.profile``."""
MEMORY_WINDOW = StepWindow(warmup=1, steps=20)
"""``scalpel memory`` / ``torchscalpel.memory`` (all steps instead under a memory limit)."""

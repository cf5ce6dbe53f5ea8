"""The shape every verb's options take, and the numbers the script-running verbs share.

Each verb has one options class (``DoctorOptions``, ``MemoryOptions``, ``ProfileOptions``, ``TuneOptions``,
``LrOptions``, ``BatchOptions``, ``FixOptions``...): a frozen, keyword-only, slotted dataclass that validates
itself on construction, built by the CLI (``Options.from_args(namespace)``) and by the in-process API from the
same defaults. :class:`StageOptions` is their base and refuses a subclass of any other shape, so a mutable or
positional options class cannot be added by accident. Torch-free: the CLI builds options before torch loads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from torchscalpel.errors import ArgumentError, UsageError

STEP_TIMEOUT_S = 600.0
"""Seconds a run waits for its first recognised step before stopping the script (``--step-timeout``):
a loop the runtime cannot recognise must not run to its end."""

PROFILE_EVENT_BUDGET = 200_000
"""Trace events one profiler window may hold (``--profile-budget``). Measured on a loaded 2-core machine: a
window of 986k events (shapes and memory on) held 4 GiB of RSS and took 96 s to export; 200k is about 0.8 GiB
and 20 s."""


ARGUMENT_FLAGS: dict[str, str] = {
    "warmup": "--warmup",
    "steps": "--steps",
    "profile_steps": "--profile-steps",
    "profile_event_budget": "--profile-budget",
    "step_kind": "--step-kind",
    "step_timeout_s": "--step-timeout",
    "time_cap_s": "--time-cap",
    "tail_cap_s": "--tail-cap",
    "memory_limit": "--memory-limit",
    "min_lr": "--min",
    "max_lr": "--max",
    "sizes": "--sizes",
    "budget_s": "--budget",
    "min_measure_s": "--min-measure",
    "confirm_pairs": "--confirm",
    "grad_accum": "--grad-accum",
    "nodes": "--nodes",
    "world_size": "--world-size",
    "strategy": "--strategy",
    "model": "--model",
    "batch": "--batch",
    "nproc": "--nproc",
    "patch": "--patch",
    "static": "--static",
}
"""The command-line flag of each options field a validation sentence may name (one spelling per field
across the verbs): the library says ``warmup must be ...``, the CLI ``--warmup must be ...``."""


def usage_error(exc: ValueError) -> UsageError:
    """A validation error as the CLI says it: one sentence naming the flags the user typed, exit code 2."""
    text = exc.worded(ARGUMENT_FLAGS) if isinstance(exc, ArgumentError) else str(exc)
    return UsageError(f"{text}.")


def shape_problem(cls: type) -> str | None:
    """Why ``cls`` is not a frozen, keyword-only, slotted dataclass (None when it is)."""
    params = cls.__dict__.get("__dataclass_params__")
    if params is None:
        return "is not a dataclass of its own (decorate it with @dataclass(frozen=True, kw_only=True, slots=True))"
    if not params.frozen:
        return "is not frozen (options never change after validation)"
    if "__slots__" not in cls.__dict__:
        return "has no __slots__ (pass slots=True)"
    positional = [f.name for f in dataclasses.fields(cls) if not f.kw_only]
    if positional:
        return f"takes {', '.join(positional)} by position (pass kw_only=True)"
    return None


class StageOptions:
    """The base of every verb's options class.

    A subclass must be a ``@dataclass(frozen=True, kw_only=True, slots=True)``. ``slots=True`` makes the
    dataclass build its class a second time, with its fields in the class: :meth:`__init_subclass__` checks
    that class when it is defined (not frozen, fields by position: ``TypeError`` at import). A class that is
    not a slotted dataclass at all is never built that second time; the check then runs when the class is
    first instantiated, before any value is accepted.
    """

    __slots__ = ()
    _checked: ClassVar[set[type]] = set()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__dataclass_params__" in cls.__dict__:  # the class @dataclass(slots=True) built: check it now
            problem = shape_problem(cls)
            if problem is not None:
                raise TypeError(f"options class {cls.__qualname__} {problem}")
            StageOptions._checked.add(cls)

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls not in StageOptions._checked:
            problem = shape_problem(cls)
            if problem is not None:
                raise TypeError(f"options class {cls.__qualname__} {problem}")
            StageOptions._checked.add(cls)
        return object.__new__(cls)

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes``, validated again (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

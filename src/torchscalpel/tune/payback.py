"""Pays-back arithmetic: a candidate's one-time cost against its per-step gain, over the run's length.

A candidate with a start-up cost (``torch.compile``, CUDA graphs, DataLoader workers) is faster per step
only after it has paid its start-up: ``compile: 1.80x per step, 41 s to compile, pays back after 95
steps; this run does 2,000 (1.75x end to end)``. Per step and end to end are two figures, said apart.

- **one-time cost**: the warm-up steps' time above as many steady steps (``TrialResult.startup_ms``:
  compile, the first call's allocations, workers starting), the candidate's less the baseline's beside
  it (their own first-step cost is the script's, not the knob's). For a confirmed candidate both are
  the medians over its confirmation runs; dynamo's own compile time is kept beside it.
- **per-step gain**: ``baseline ms - candidate ms`` of the pair the speedup is the ratio of
  (:func:`torchscalpel.tune.speedup.speedup_of`).
- **pays back after** ``ceil(one-time cost / per-step gain)`` steps; never when the step is not faster.
- **the run's length**, when the script's arguments tell it (:func:`run_steps`): ``--steps N`` style
  flags, or ``--epochs E`` times the first DataLoader's batches; end to end is then
  ``N x baseline / (N x candidate + one-time cost)``.

Pure arithmetic on trial dicts or objects (the report reads records); no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchscalpel.tune.speedup import speedup_of

STEP_FLAGS = re.compile(
    r"^--?(max[-_]?steps|steps|num[-_]steps|total[-_]steps|train[-_]steps|max[-_]iters|iters|iterations"
    r"|num[-_]iterations|max[-_]iterations|num[-_]batches)$"
)
"""Script flags whose value is the run's optimizer steps."""
EPOCH_FLAGS = re.compile(r"^--?(epochs|num[-_]epochs|num[-_]train[-_]epochs|max[-_]epochs|n[-_]epochs)$")
"""Script flags whose value is the run's epochs (times the DataLoader's batches: steps)."""
COLD_FACTOR = 1.5
"""A compile's first run is said apart when its one-time cost is this many times the confirmed one."""


@dataclass(frozen=True, slots=True)
class RunLength:
    """How many steps the user's run does, and where that came from."""

    steps: int
    source: str
    """``--steps 2000`` or ``--epochs 3 x 469 batches``."""


def _flag_values(args: Sequence[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for i, arg in enumerate(args):
        if "=" in arg and arg.startswith("-"):
            name, value = arg.split("=", 1)
            out.append((name, value))
        elif arg.startswith("-") and i + 1 < len(args):
            out.append((arg, args[i + 1]))
    return out


def run_steps(args: Sequence[str], batches_per_epoch: int | None) -> RunLength | None:
    """The run's steps from the script's own arguments (the last such flag wins), or None."""
    found: RunLength | None = None
    for name, value in _flag_values(list(args)):
        if not value.isdigit() or int(value) <= 0:
            continue
        if STEP_FLAGS.match(name):
            found = RunLength(int(value), f"{name} {value}")
        elif EPOCH_FLAGS.match(name) and batches_per_epoch and (found is None or "x" in found.source):
            found = RunLength(int(value) * batches_per_epoch, f"{name} {value} x {batches_per_epoch} batches")
    return found


def _get(trial: Any, key: str) -> Any:
    return trial.get(key) if isinstance(trial, Mapping) else getattr(trial, key, None)


def has_startup_cost(settings: Mapping[str, Any]) -> str:
    """What the candidate pays once (``compile``, ``workers``), or "" when nothing of it starts up."""
    if settings.get("compile"):
        return "compile"
    loader = settings.get("dataloader") or {}
    if isinstance(loader, Mapping) and loader.get("num_workers"):
        return "workers"
    return ""


@dataclass(frozen=True, slots=True)
class Payback:
    """A candidate's start-up cost against its per-step gain."""

    label: str
    kind: str
    """``compile`` or ``workers``: what starts up."""
    per_step: float
    """Per-step speedup (the one definition, :func:`~torchscalpel.tune.speedup.speedup_of`)."""
    baseline_ms: float
    """Baseline step time of the pair the per-step speedup is the ratio of."""
    candidate_ms: float
    """Candidate step time of that pair."""
    one_time_s: float
    """Start-up cost above the baseline's, seconds (0 when the baseline's was larger)."""
    compile_s: float | None
    """Dynamo's own compile time in the same run(s), seconds (None: not a compile, or not recorded)."""
    steps: int | None
    """Steps after which the start-up is paid back (None: never, the step is not faster)."""
    run: RunLength | None
    """The user's run length, when the script's arguments tell it."""
    first_s: float | None = None
    """For a confirmed compile: the one-time cost of its first (screening) run above the baseline's,
    seconds, when it was well above ``one_time_s``: inductor's cache was cold then, as it is on a new
    machine; the confirmation runs found it warm, as the user's next run on this machine will."""

    def end_to_end(self, steps: int | None = None) -> float | None:
        """Speedup over ``steps`` (default: the run's) with the start-up counted; None without a length."""
        n = steps if steps is not None else (self.run.steps if self.run else None)
        if not n:
            return None
        return n * self.baseline_ms / (n * self.candidate_ms + 1000.0 * self.one_time_s)

    @property
    def saved_ms(self) -> float:
        """Milliseconds saved per step (negative: slower)."""
        return self.baseline_ms - self.candidate_ms

    def sentence(self) -> str:
        """``compile: 1.80x per step, 41 s to compile, pays back after 95 steps; this run does 2,000
        steps (--steps 2000): 1.75x end to end``."""
        cost = f"{self.one_time_s:.1f} s to {'compile' if self.kind == 'compile' else 'start the workers'}"
        if self.compile_s is not None and self.kind == "compile":
            cost += f" (dynamo's own compile time {self.compile_s:.1f} s)"
        head = f"{self.label}: {self.per_step:.2f}x per step, {cost}"
        if self.steps is None:
            return f"{head}: never pays back (the step is not faster)"
        text = f"{head}, pays back after {self.steps:,} steps"
        if self.first_s is not None and self.saved_ms > 0:
            cold_steps = math.ceil(1000.0 * self.first_s / self.saved_ms)
            text += f" ({self.first_s:.1f} s and {cold_steps:,} steps on a cold inductor cache, as on a new machine)"
        if self.run is None:
            return f"{text}; the run's length is not known from its arguments (--steps / --epochs)"
        e2e = self.end_to_end()
        verdict = "pays back" if self.run.steps >= self.steps else "does NOT pay back"
        return (
            f"{text}; this run does {self.run.steps:,} steps ({self.run.source}): {verdict}, "
            f"{e2e:.2f}x end to end"
            if e2e is not None
            else f"{text}; this run does {self.run.steps:,} steps ({self.run.source})"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``sections["tune"]["paybacks"]``)."""
        e2e = self.end_to_end()
        return {
            "label": self.label,
            "kind": self.kind,
            "per_step": round(self.per_step, 4),
            "saved_ms": round(self.saved_ms, 3),
            "one_time_s": round(self.one_time_s, 3),
            "compile_s": None if self.compile_s is None else round(self.compile_s, 3),
            "first_s": None if self.first_s is None else round(self.first_s, 3),
            "steps": self.steps,
            "run_steps": self.run.steps if self.run else None,
            "run_source": self.run.source if self.run else None,
            "end_to_end": None if e2e is None else round(e2e, 4),
            "sentence": self.sentence(),
        }


def payback_of(trial: Any, baseline: Any, run: RunLength | None) -> Payback | None:
    """The pays-back figures of ``trial`` (a candidate with a start-up cost and a measured speedup),
    against the ``baseline`` run's own start-up; None when it has no start-up cost or no measurement."""
    kind = has_startup_cost(_get(trial, "settings") or {})
    measured = speedup_of(trial)
    if not kind or measured.ratio is None or not measured.baseline_ms or not measured.candidate_ms:
        return None
    startup = _get(trial, "startup_ms")
    if startup is None:
        return None
    base_startup = _get(trial, "baseline_startup_ms")
    if base_startup is None:
        base_startup = _get(baseline, "startup_ms") or 0.0
    one_time_s = max(0.0, (float(startup) - float(base_startup)) / 1000.0)
    saved = measured.baseline_ms - measured.candidate_ms
    stats = _get(trial, "compile") or {}
    compile_ms = stats.get("confirm_compile_ms") or stats.get("compile_ms")
    steps = math.ceil(1000.0 * one_time_s / saved) if saved > 0 else None
    first = stats.get("first_startup_ms")
    first_s = max(0.0, (float(first) - float(base_startup)) / 1000.0) if first is not None else None
    if first_s is not None and (kind != "compile" or first_s < COLD_FACTOR * max(one_time_s, 0.1)):
        first_s = None  # the first run was no slower to start: the cache was warm already
    return Payback(
        label=str(_get(trial, "label") or kind),
        kind=kind,
        per_step=measured.ratio,
        baseline_ms=measured.baseline_ms,
        candidate_ms=measured.candidate_ms,
        one_time_s=one_time_s,
        compile_s=float(compile_ms) / 1000.0 if compile_ms and kind == "compile" else None,
        steps=steps,
        run=run,
        first_s=first_s,
    )


def paybacks(trials: Sequence[Any], baseline: Any, run: RunLength | None) -> list[Payback]:
    """:func:`payback_of` for every trial that has one, in the order given."""
    out = []
    for trial in trials:
        value = payback_of(trial, baseline, run)
        if value is not None:
            out.append(value)
    return out

"""What a tune search is asked to do (:class:`TuneOptions`) and how it reports while it runs
(:class:`Progress`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from torchscalpel.runtime.window import check_window
from torchscalpel.tune.knobs import KNOB_NAMES
from torchscalpel.tune.runner import TrialResult

MAX_MEASURED_STEPS = 400
"""Upper bound on the measured steps per trial that ``min_measure_s`` may ask for."""


@dataclass(kw_only=True, slots=True)
class TuneOptions:
    """How long and how hard to search."""

    out_dir: Path
    """Folder for trial runs (one sub-folder each), the record and the report."""
    budget_s: float = 600.0
    """Wall-clock budget for the whole search, baseline included."""
    warmup: int = 3
    """Steps excluded from timing (compilation happens here)."""
    steps: int = 10
    """Measured steps per trial (at least; see ``min_measure_s``)."""
    min_measure_s: float = 0.0
    """Measured wall time each trial should reach: when the baseline's steps are short, every
    trial after the first baseline run measures ``ceil(min_measure_s / step time)`` steps instead of
    ``steps`` (at most :data:`MAX_MEASURED_STEPS`), so a 15 ms step is not judged on 0.15 s of
    timing. 0 keeps the fixed ``steps``."""
    seed: int = 0
    """torch.manual_seed before the script, the same for every trial."""
    knobs: tuple[str, ...] = KNOB_NAMES
    """Knob families to try."""
    compile_backend: str = "inductor"
    compile_modes: tuple[str, ...] = ("default",)
    confirm_pairs: int = 3
    """Interleaved baseline/candidate pairs for the final check."""
    step_kind: str = "auto"
    """What ends a step in every trial (``--step-kind``)."""
    cache_dir: Path | None = None
    """TORCHINDUCTOR_CACHE_DIR for the trials (default: the environment's, else inductor's per-user cache)."""

    def __post_init__(self) -> None:
        if self.budget_s <= 0:
            raise ValueError("--budget must be positive")
        if self.steps < 2:
            raise ValueError("--steps must be at least 2, so a median step time exists")
        if self.min_measure_s < 0:
            raise ValueError("--min-measure must not be negative")
        check_window(warmup=self.warmup, steps=self.steps, step_kind=self.step_kind)
        unknown = [k for k in self.knobs if k not in KNOB_NAMES]
        if unknown:
            raise ValueError(f"unknown knob(s) {', '.join(unknown)}; choose from {', '.join(KNOB_NAMES)}")

    def measured_steps(self, step_ms: float | None) -> int:
        """Measured steps per trial for a step of ``step_ms``: ``steps``, or more when that many
        steps would be timed for less than ``min_measure_s``."""
        if not self.min_measure_s or not step_ms or step_ms <= 0:
            return self.steps
        wanted = -(-self.min_measure_s * 1000.0 // step_ms)  # ceil
        return int(min(MAX_MEASURED_STEPS, max(self.steps, wanted)))


class Progress(Protocol):
    """What the search reports while it runs (the CLI draws it with rich)."""

    def message(self, text: str) -> None: ...

    def trial_started(
        self, label: str, limit_s: float, *, index: int = 0, total: int = 0, left_s: float = 0.0
    ) -> None:
        """Trial ``index`` of ``total`` (the plan as it stands; it shrinks when the budget runs out
        or a stage ends early) starts, with ``left_s`` seconds of the budget left."""

    def trial_finished(self, result: TrialResult) -> None: ...


class SilentProgress:
    """A :class:`Progress` that shows nothing."""

    def message(self, text: str) -> None:
        return None

    def trial_started(
        self, label: str, limit_s: float, *, index: int = 0, total: int = 0, left_s: float = 0.0
    ) -> None:
        return None

    def trial_finished(self, result: TrialResult) -> None:
        return None

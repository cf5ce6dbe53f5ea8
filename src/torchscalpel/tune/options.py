"""What a tune search is asked to do (:class:`TuneOptions`) and how it reports while it runs
(:class:`Progress`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torchscalpel.errors import ArgumentError, UsageError
from torchscalpel.options import StageOptions
from torchscalpel.runtime.window import check_window
from torchscalpel.tune.knobs import KNOB_NAMES
from torchscalpel.tune.runner import TrialResult
from torchscalpel.tune.window import (
    CONFIRM_PAIRS,
    FIT_STEPS,
    MIN_MEASURE_S,
    TUNE_BUDGET_S,
    TUNE_STEPS,
    TUNE_WARMUP,
)

if TYPE_CHECKING:
    from torchscalpel.runtime.target import Target

MAX_MEASURED_STEPS = 400
"""Upper bound on the measured steps per trial that ``min_measure_s`` may ask for."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TuneOptions(StageOptions):
    """How long and how hard to search."""

    out_dir: Path | None = None
    """Folder for trial runs (one sub-folder each), the record and the report (:attr:`folder`); the CLI
    validates the flags first and names the folder once the target is known."""
    budget_s: float = TUNE_BUDGET_S
    """Wall-clock budget for the whole search, baseline included."""
    warmup: int = TUNE_WARMUP
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
    confirm_pairs: int = CONFIRM_PAIRS
    """Interleaved baseline/candidate pairs for the final check."""
    step_kind: str = "auto"
    """What ends a step in every trial (``--step-kind``)."""
    cache_dir: Path | None = None
    """TORCHINDUCTOR_CACHE_DIR for the trials (default: the environment's, else inductor's per-user cache)."""
    fit: str | None = None
    """``--fit SIZE``: the size as the user typed it (checked by the shared size rule); the search is then
    the memory ladder's, measured (:mod:`torchscalpel.tune.fit`), not the knob search."""
    target: Target | None = field(default=None, compare=False)
    """The script or module to tune (:func:`torchscalpel.stages.tune.run`)."""
    config_path: Path | None = None
    """Where else to write the winning settings (``--config``; a file not written by scalpel tune is never
    overwritten); None: only the run folder's scalpel.toml."""
    json_path: Path | None = None
    """Also write the baseline's record, with the search in its ``sections["tune"]``, here."""
    patch: bool = False
    """Also write fix.patch in the run folder (the search, not ``fit``)."""
    tensorboard: Path | None = None
    """Also write the baseline's run to this TensorBoard log folder."""
    mlflow: str | None = None
    """Also log the baseline's run to this MLflow tracking URI or folder."""
    out_root: Path | None = field(default=None, compare=False)
    """Where the default run folder goes (the config file's ``out_root``; None: ``scalpel-runs``)."""
    command: tuple[str, ...] = field(default=(), compare=False)
    """The command line the record keeps."""

    def __post_init__(self) -> None:
        if self.budget_s <= 0:
            raise ArgumentError("{budget_s} must be positive")
        if self.steps < 2:
            raise ArgumentError("{steps} must be at least 2, so a median step time exists")
        if self.min_measure_s < 0:
            raise ArgumentError("{min_measure_s} must not be negative")
        check_window(warmup=self.warmup, steps=self.steps, step_kind=self.step_kind)
        unknown = [k for k in self.knobs if k not in KNOB_NAMES]
        if unknown:
            raise ValueError(f"unknown knob(s) {', '.join(unknown)}; choose from {', '.join(KNOB_NAMES)}")
        if self.confirm_pairs < 1:
            raise ArgumentError(
                "{confirm_pairs} must be at least 1: nothing is recommended without a confirmation run"
            )
        if self.patch and self.fit is not None:
            raise ArgumentError("{patch} goes with the search, not {fit}")
        if self.fit is not None:
            from torchscalpel.units import parse_size

            parse_size(self.fit, flag="--fit")  # one sentence and exit 2 for a bad size, before any trial

    @property
    def folder(self) -> Path:
        """:attr:`out_dir`, which a search needs (ValueError when it was never named)."""
        if self.out_dir is None:
            raise ValueError("a tune search needs out_dir, the folder of its trials and record")
        return self.out_dir

    @property
    def fit_steps(self) -> int:
        """Measured steps of each ``--fit`` trial."""
        return min(self.steps, FIT_STEPS)

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> TuneOptions:
        """The options ``scalpel tune``'s parsed flags ask for, ``--fit`` included; a bad flag is one
        :class:`UsageError` sentence naming it, before the target is looked at. Without ``--out`` the stage
        names the run folder."""
        from torchscalpel.options import usage_error
        from torchscalpel.runtime.target import target_from_args
        from torchscalpel.runtime.window import check_warmup, parse_steps
        from torchscalpel.tune.settings import COMPILE_MODES
        from torchscalpel.units import parse_duration

        if getattr(args, "patch", False) and args.fit:
            raise UsageError(
                "--patch goes with the search, not --fit; run 'scalpel memory --patch' for memory fixes."
            )
        budget = parse_duration(args.budget, flag="--budget")
        knobs = parse_knobs(args.knobs)
        modes = tuple(m.strip() for m in args.compile_mode.split(",") if m.strip())
        bad = [m for m in modes if m not in COMPILE_MODES]
        if bad or not modes:
            raise UsageError(f"--compile-mode takes {', '.join(COMPILE_MODES)}, not {args.compile_mode!r}.")
        try:
            check_warmup(args.warmup)
            steps = parse_steps(args.steps, minimum=2)
        except ValueError as exc:
            raise usage_error(exc) from None
        if steps == "all":
            raise UsageError(
                f"--steps all would let every trial run to the script's end; give a number (default {TUNE_STEPS})."
            )
        min_measure = (
            args.min_measure if args.min_measure is not None else (MIN_MEASURE_S if steps == "auto" else 0.0)
        )
        if args.confirm < 1:
            raise UsageError(
                "--confirm must be at least 1: nothing is recommended without a confirmation run."
            )
        try:
            options = cls(
                budget_s=budget,
                warmup=args.warmup,
                steps=TUNE_STEPS if steps == "auto" else steps,
                seed=args.seed,
                knobs=knobs,
                compile_backend=args.compile_backend,
                compile_modes=modes,
                confirm_pairs=args.confirm,
                step_kind=args.step_kind,
                min_measure_s=min_measure,
                fit=args.fit or None,
                config_path=getattr(args, "config", None),
                json_path=getattr(args, "json_path", None),
                patch=getattr(args, "patch", False),
                tensorboard=getattr(args, "tensorboard", None),
                mlflow=getattr(args, "mlflow", None),
                out_dir=getattr(args, "out", None),
                out_root=getattr(args, "out_root", None),
                command=("scalpel", *sys.argv[1:]),
                **fields,
            )
        except ValueError as exc:
            raise usage_error(exc) from None
        return options.replace(target=target_from_args(args))

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


def parse_knobs(text: str | None) -> tuple[str, ...]:
    """``--knobs amp,compile`` -> ``("amp", "compile")``; raise UsageError naming unknown ones."""
    if not text:
        return KNOB_NAMES
    names = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in names if k not in KNOB_NAMES]
    if unknown:
        raise UsageError(
            f"Unknown knob {', '.join(unknown)} in --knobs; choose from {', '.join(KNOB_NAMES)}."
        )
    return names

"""What a learning-rate range test sweeps: one frozen, validated object for the CLI and the tests."""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchscalpel.errors import ArgumentError, literal
from torchscalpel.lrfind.sweep import schedule
from torchscalpel.options import STEP_TIMEOUT_S, StageOptions

if TYPE_CHECKING:
    from torchscalpel.runtime.target import Target

DEFAULT_MIN_LR = 1e-7
DEFAULT_MAX_LR = 10.0
DEFAULT_STEPS = 100
MIN_STEPS = 8
"""Fewer points leave nothing between the skipped start and end to take a slope over."""
DIVERGENCE_FACTOR = 4.0
"""The run stops when the smoothed loss exceeds this multiple of its minimum (Lightning's and fastai's 4)."""
SMOOTHING = 0.98
"""The exponential moving average's beta (Lightning's and fastai's)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LrOptions(StageOptions):
    """A range test: ``steps`` optimizer steps from ``min_lr`` to ``max_lr``, exponentially spaced."""

    min_lr: float = DEFAULT_MIN_LR
    max_lr: float = DEFAULT_MAX_LR
    steps: int = DEFAULT_STEPS
    out_dir: Path | None = None
    """The run folder (run.json, report.html); nothing is written when None."""
    name: str = "run"
    step_kind: str = "auto"
    step_timeout_s: float | None = STEP_TIMEOUT_S
    divergence_factor: float = DIVERGENCE_FACTOR
    smoothing: float = SMOOTHING
    target: Target | None = field(default=None, compare=False)
    """The script or module to sweep (:func:`torchscalpel.stages.lr.run`)."""
    report: bool = True
    """Write report.html beside run.json."""
    out_root: Path | None = field(default=None, compare=False)
    """Where the default run folder goes (the config file's ``out_root``; None: ``scalpel-runs``)."""
    command: tuple[str, ...] = field(default=(), compare=False)
    """The command line the record keeps."""

    def __post_init__(self) -> None:
        for name, value in (("min_lr", self.min_lr), ("max_lr", self.max_lr)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ArgumentError(
                    "{" + name + "} must be a positive finite learning rate, got " + literal(value)
                )
        if self.min_lr >= self.max_lr:
            raise ArgumentError(f"{{min_lr}} ({self.min_lr:g}) must be below {{max_lr}} ({self.max_lr:g})")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < MIN_STEPS:
            raise ArgumentError(
                f"{{steps}} must be a whole number of at least {MIN_STEPS}, got " + literal(self.steps)
            )
        # Both ends finite is not enough: the schedule is min * (max/min) ** t, and a ratio past the largest
        # float is inf (--max 1e308 from 1e-7 swept lr = inf and wrote NaN into run.json).
        ratio = self.max_lr / self.min_lr
        lrs = schedule(self.min_lr, self.max_lr, self.steps) if math.isfinite(ratio) else []
        if not lrs or not all(math.isfinite(lr) and lr > 0 for lr in lrs):
            decades = math.log10(self.max_lr) - math.log10(self.min_lr)
            raise ArgumentError(
                f"{{max_lr}} {self.max_lr:g} is {decades:.0f} decades above {{min_lr}} {self.min_lr:g}: the sweep's "
                f"ratio max/min overflows a float (at most {math.log10(sys.float_info.max):.0f} decades); lower "
                "{max_lr} or raise {min_lr}"
            )
        if not (math.isfinite(self.divergence_factor) and self.divergence_factor > 1):
            raise ValueError(f"the divergence factor must be above 1, got {self.divergence_factor}")
        if not (0 <= self.smoothing < 1):
            raise ValueError(f"the smoothing must be in [0, 1), got {self.smoothing}")

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> LrOptions:
        """The sweep ``scalpel lr``'s parsed flags ask for: the sweep checked first, then the script
        (``fields``: any other field). Without ``--out`` the stage names the run folder."""
        from torchscalpel.runtime.target import target_from_args

        options = cls(
            min_lr=args.min_lr,
            max_lr=args.max_lr,
            steps=args.steps,
            step_kind=args.step_kind,
            step_timeout_s=args.step_timeout,
            report=not getattr(args, "no_report", False),
            command=("scalpel", *sys.argv[1:]),
            **{"name": "lr", **fields},
        )
        target = target_from_args(args)
        return options.replace(
            target=target,
            out_dir=getattr(args, "out", None),
            out_root=getattr(args, "out_root", None),
            name=f"lr-{target.name}",
        )

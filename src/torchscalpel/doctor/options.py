"""What ``scalpel doctor`` is asked: one frozen, validated object shared by the CLI, the demo and the
in-process API (defaults from :mod:`torchscalpel.doctor.window`)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torchscalpel.doctor.window import DOCTOR_WINDOW, TAIL_CAP_S, TIME_CAP_S
from torchscalpel.errors import ArgumentError, literal
from torchscalpel.options import StageOptions
from torchscalpel.runtime.window import check_window


@dataclass(frozen=True, kw_only=True, slots=True)
class DoctorOptions(StageOptions):
    """The doctor's run window and what it checks besides the runtime rules.

    Construction validates (:class:`~torchscalpel.errors.ArgumentError`, a ``ValueError`` whose sentence
    names the field; the CLI words it with the flag), so a bad value is refused before the script starts."""

    steps: int | Literal["all", "auto"] | None = "auto"
    """Measured steps; ``"auto"``: :data:`~torchscalpel.doctor.window.DEFAULT_STEPS` (30 per rank under a
    launcher); ``"all"`` or None: until the script ends (None as in ``torchscalpel.doctor(steps=None)``)."""
    warmup: int = DOCTOR_WINDOW.warmup
    sanity: bool = False
    """Also try to overfit one batch (``--sanity``)."""
    static: bool = True
    """Also run the static rules on the script and the model sources it used."""
    nan_rerun: bool = True
    """Re-run to locate the first NaN when the loss became NaN."""
    out_dir: Path | None = None
    step_kind: str = DOCTOR_WINDOW.step_kind
    step_timeout_s: float | None = DOCTOR_WINDOW.step_timeout_s
    time_cap_s: float | None = TIME_CAP_S
    """Wall-clock cap of the window (None or 0: none); when it cut the window, the record says so."""
    tail_cap_s: float | None = None
    """After a training window that ended on its step count, run on for up to this many seconds under the
    cheap checks only; 0: stop at the window's end; None: :data:`~torchscalpel.doctor.window.TAIL_CAP_S` with
    the default window (``steps="auto"``), no tail when ``steps`` is a number the caller chose."""
    step_scalars: bool = False
    """Record each step's learning rate and clipped gradient norm (for ``--tensorboard`` / ``--mlflow``)."""

    def __post_init__(self) -> None:
        steps = self.steps
        if isinstance(steps, str) and steps not in ("all", "auto"):
            raise ArgumentError("{steps} must be a number, 'auto' or 'all', got " + literal(repr(steps)))
        check_window(
            warmup=self.warmup,
            steps=steps if isinstance(steps, int) else None,
            step_kind=self.step_kind,
            step_timeout_s=self.step_timeout_s,
        )
        if self.time_cap_s is not None and not (math.isfinite(self.time_cap_s) and self.time_cap_s >= 0):
            raise ArgumentError(
                "{time_cap_s} must be 0 (no cap) or a number of seconds, got " + literal(self.time_cap_s)
            )

        if self.tail_cap_s is not None and not (math.isfinite(self.tail_cap_s) and self.tail_cap_s >= 0):
            raise ArgumentError(
                "{tail_cap_s} must be 0 (no tail) or a number of seconds, got " + literal(self.tail_cap_s)
            )

    @property
    def planned_steps(self) -> int | None:
        """The measured steps of one process's window: ``"auto"`` is
        :data:`~torchscalpel.doctor.window.DEFAULT_STEPS`, ``"all"`` and None are None (until the end). The one
        place ``auto`` becomes a number (a launcher's ranks take ``RANK_STEPS`` instead: see ``diagnose``)."""
        if self.steps == "auto":
            return DOCTOR_WINDOW.steps
        return None if self.steps in ("all", None) else int(self.steps)

    @property
    def tail_s(self) -> float | None:
        """The tail in force for one process (None: none): the caller's ``tail_cap_s``, else
        :data:`~torchscalpel.doctor.window.TAIL_CAP_S` with the default window; never when the run goes to
        the script's end anyway (``steps="all"``)."""
        if self.planned_steps is None:
            return None
        if self.tail_cap_s is not None:
            return self.tail_cap_s or None
        return TAIL_CAP_S if self.steps == "auto" else None

    @property
    def cap_s(self) -> float | None:
        """The time cap in force: None when there is none (``time_cap_s`` None or 0)."""
        return self.time_cap_s or None

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> DoctorOptions:
        """The options ``scalpel doctor``'s parsed flags ask for (``fields``: those the command line does not
        hold, e.g. ``out_dir``). ``args.steps`` is the parsed ``--steps`` (a number, ``all`` or ``auto``)."""
        from torchscalpel.runtime.window import parse_steps

        steps = parse_steps(args.steps)
        return cls(
            steps=steps if steps in ("all", "auto") else int(steps),
            warmup=args.warmup,
            sanity=args.sanity,
            static=not args.no_static,
            step_kind=args.step_kind,
            step_timeout_s=args.step_timeout,
            time_cap_s=args.time_cap or None,
            tail_cap_s=getattr(args, "tail_cap", None),
            # the learning-rate and gradient-norm curves are recorded only for a tracker that shows them
            step_scalars=bool(getattr(args, "tensorboard", None) or getattr(args, "mlflow", None)),
            **fields,
        )

"""What ``scalpel doctor`` is asked: one frozen, validated object shared by the CLI, the demo and the
in-process API (defaults from :mod:`torchscalpel.doctor.window`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from torchscalpel.doctor.window import DOCTOR_WINDOW, TIME_CAP_S
from torchscalpel.runtime.window import check_window


@dataclass(frozen=True, kw_only=True, slots=True)
class DoctorOptions:
    """The doctor's run window and what it checks besides the runtime rules.

    Construction validates (``ValueError`` with a sentence that names the flag), so a bad value is
    refused before the script starts."""

    steps: int | Literal["all", "auto"] | None = "auto"
    """Measured steps; ``"auto"`` or None: :data:`~torchscalpel.doctor.window.DEFAULT_STEPS` (30 per rank
    under a launcher); ``"all"``: until the script ends."""
    warmup: int = DOCTOR_WINDOW.warmup
    sanity: bool = False
    """Also try to overfit one batch (``--sanity``)."""
    static: bool = True
    """Also run the static rules on the script and the model sources it used."""
    nan_rerun: bool = True
    """Re-run to locate the first NaN when the loss became NaN."""
    out_dir: Path | None = None
    step_kind: str = "auto"
    step_timeout_s: float | None = 600.0
    time_cap_s: float | None = TIME_CAP_S
    """Wall-clock cap of the window (None or 0: none); when it cut the window, the record says so."""
    step_scalars: bool = False
    """Record each step's learning rate and clipped gradient norm (for ``--tensorboard`` / ``--mlflow``)."""

    def __post_init__(self) -> None:
        steps = self.steps
        if isinstance(steps, str) and steps not in ("all", "auto"):
            raise ValueError(f"--steps must be a number, 'auto' or 'all', got {steps!r}")
        check_window(
            warmup=self.warmup,
            steps=steps if isinstance(steps, int) else None,
            step_kind=self.step_kind,
            step_timeout_s=self.step_timeout_s,
        )
        if self.time_cap_s is not None and not (math.isfinite(self.time_cap_s) and self.time_cap_s >= 0):
            raise ValueError(f"--time-cap must be 0 (no cap) or a number of seconds, got {self.time_cap_s}")

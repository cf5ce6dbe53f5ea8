"""The knob registry: one knob family per module, in the order the search tries them."""

from __future__ import annotations

from torchscalpel.tune.knobs.amp import AmpKnob
from torchscalpel.tune.knobs.backends import CudnnBenchmarkKnob, MatmulPrecisionKnob
from torchscalpel.tune.knobs.base import (
    CLOSE,
    EXACT,
    LOW_PRECISION,
    NUMERICS_ORDER,
    ApplyLog,
    Knob,
    SetupHook,
    Undo,
)
from torchscalpel.tune.knobs.checkpointing import CheckpointingKnob
from torchscalpel.tune.knobs.compile import CompileKnob
from torchscalpel.tune.knobs.dataloader import DataLoaderKnob
from torchscalpel.tune.knobs.layout import ChannelsLastKnob
from torchscalpel.tune.knobs.microbatch import MicrobatchKnob
from torchscalpel.tune.knobs.optimizer import OptimizerImplKnob
from torchscalpel.tune.knobs.threads import ThreadsKnob
from torchscalpel.tune.settings import KNOB_NAMES

__all__ = [
    "CLOSE",
    "EXACT",
    "KNOB_NAMES",
    "LOW_PRECISION",
    "NUMERICS_ORDER",
    "ApplyLog",
    "Knob",
    "SetupHook",
    "Undo",
    "all_knobs",
]


def all_knobs(
    *, compile_backend: str = "inductor", compile_modes: tuple[str, ...] = ("default",)
) -> list[Knob]:
    """Every knob, in trial order: the cheap trials first, compile (a 15-25 s cold compile per trial on a
    CPU) last, so a short budget still measures every cheap knob and compile gets what is left."""
    return [
        AmpKnob(),
        ThreadsKnob(),
        DataLoaderKnob(),
        OptimizerImplKnob(),
        ChannelsLastKnob(),
        MatmulPrecisionKnob(),
        CudnnBenchmarkKnob(),
        CompileKnob(backend=compile_backend, modes=compile_modes),
        CheckpointingKnob(),
        MicrobatchKnob(),
    ]

"""The names ``scalpel plan`` accepts: precisions, optimizers, strategies.

Torch-free, because the CLI parser offers them as choices and every ``scalpel`` command builds
that parser; the modules that act on them (simulate, strategies) import torch.
"""

from __future__ import annotations

import enum
from typing import Any

from torchscalpel.errors import UsageError


class Precision(str, enum.Enum):
    """``--precision``: a ``str`` enum, so it compares equal to, prints as and is stored as its value."""

    FP32 = "fp32"
    BF16_MIXED = "bf16-mixed"
    """bf16 autocast over fp32 parameters."""
    FP16_MIXED = "fp16-mixed"
    """fp16 autocast over fp32 parameters, with GradScaler's scaled loss."""
    BF16 = "bf16"
    """The whole model (parameters, buffers, float inputs) in bf16."""
    FP64 = "fp64"
    """The whole model in float64 (``model.double()``: time_sequence_prediction, scientific models)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def parse(cls, value: str | Precision) -> Precision:
        """The precision for a name; a UsageError naming ``--precision`` for anything else."""
        try:
            return cls(value)
        except ValueError:
            raise UsageError(
                f"Unknown precision {value!r}; use --precision {' / '.join(PRECISIONS)}."
            ) from None


PRECISIONS = tuple(p.value for p in Precision)

OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "adamw": ("torch.optim.AdamW", {"lr": 1e-3}),
    "adam": ("torch.optim.Adam", {"lr": 1e-3}),
    "sgd": ("torch.optim.SGD", {"lr": 1e-2}),
    "sgd-momentum": ("torch.optim.SGD", {"lr": 1e-2, "momentum": 0.9}),
    "adagrad": ("torch.optim.Adagrad", {"lr": 1e-2}),
    "rmsprop": ("torch.optim.RMSprop", {"lr": 1e-3}),
    "adafactor": ("torch.optim.Adafactor", {"lr": 1e-2}),
    "none": ("", {}),
}
"""``--optimizer`` names -> (class, keyword arguments)."""

STRATEGIES = ("single", "ddp", "fsdp-full", "fsdp-grad-op", "fsdp-hybrid")

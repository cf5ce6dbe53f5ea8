"""The names ``scalpel plan`` accepts: precisions, optimizers, strategies.

Torch-free, because the CLI parser offers them as choices and every ``scalpel`` command builds
that parser; the modules that act on them (simulate, strategies) import torch.
"""

from __future__ import annotations

from typing import Any

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")

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

"""Optimizer-implementation knob: ``foreach`` (multi-tensor) or ``fused`` kernels.

Applied by wrapping the ``__init__`` of every optimizer class in ``torch.optim`` that accepts the
argument, so ``AdamW(model.parameters(), lr=...)`` in the script builds the chosen implementation.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.tune.knobs.base import CLOSE, ApplyLog, Knob, SetupHook, Undo
from torchscalpel.tune.settings import TuneSettings

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts

# Optimizers with a fused kernel on CPU and CUDA in torch >= 2.4.
FUSED_CAPABLE = ("Adam", "AdamW", "SGD", "Adagrad")


class OptimizerImplKnob(Knob):
    """Pick the optimizer's fused or foreach implementation."""

    name = "optimizer"
    numerics = CLOSE
    description = "fused / foreach optimizer implementation"

    def is_set(self, settings: TuneSettings) -> bool:
        return settings.optimizer is not None

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        if not facts.optimizers:
            return [], "no torch.optim optimizer stepped"
        if facts.optimizer_impl == "fused":
            return [], "the optimizer is already fused"
        if all(name in FUSED_CAPABLE for name in facts.optimizers):
            return [TuneSettings(optimizer="fused")], None
        if facts.optimizer_impl == "foreach":
            return [], f"{', '.join(facts.optimizers)} has no fused kernel and already uses foreach"
        return [TuneSettings(optimizer="foreach")], None

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        impl = settings.optimizer
        if impl is None:
            return None
        return lambda: patch_optimizers(impl, log)

    def code_lines(self, settings: TuneSettings) -> list[str]:
        if settings.optimizer is None:
            return []
        return [f"optimizer = torch.optim.AdamW(model.parameters(), ..., {settings.optimizer}=True)"]


def patch_optimizers(impl: str, log: ApplyLog) -> Undo:
    """Make every ``torch.optim`` optimizer that accepts ``impl`` (``fused``/``foreach``) default to it."""
    originals: dict[type, Any] = {}
    for cls in vars(torch.optim).values():
        if (
            not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer))
            or cls is torch.optim.Optimizer
        ):
            continue
        init = cls.__dict__.get("__init__")
        if init is None or impl not in inspect.signature(init).parameters:
            continue
        originals[cls] = init
        cls.__init__ = _wrap_init(cls, init, impl, log)  # type: ignore[method-assign]

    def undo() -> None:
        for cls, init in originals.items():
            cls.__init__ = init  # type: ignore[misc]  # restoring the class's own __init__, saved above

    return undo


def _wrap_init(cls: type, init: Any, impl: str, log: ApplyLog) -> Any:
    other = "foreach" if impl == "fused" else "fused"
    has_other = other in inspect.signature(init).parameters

    @functools.wraps(init)
    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        # Both are keyword-only in torch.optim; fused and foreach together is an error, so clear the other.
        kwargs[impl] = True
        if has_other:
            kwargs[other] = False
        log.did("optimizer", f"{type(self).__name__}({impl}=True)")
        init(self, *args, **kwargs)

    return patched

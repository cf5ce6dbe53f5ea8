"""Non-finite loss or gradient guard: halt (default) or skip the update, on every rank at once.

Every rank contributes one flag to a MAX all-reduce, so a NaN on one rank stops or skips the
step everywhere (a rank that stepped alone would silently diverge from the others).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchscalpel.distributed.process import collective_device, get_logger
from torchscalpel.errors import ScalpelError

log = get_logger()
MODES = ("halt", "skip")


class NonFiniteError(ScalpelError):
    """Raised on every rank when the loss or a gradient is NaN/inf and the guard halts."""


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # FSDP2 gradients are DTensors


def nonfinite_flags(loss: torch.Tensor | None, model: nn.Module) -> tuple[bool, bool]:
    """(loss is non-finite, some local gradient is non-finite) on this rank."""
    bad_loss = loss is not None and not bool(torch.isfinite(loss.detach()).all())
    grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
    bad_grad = bool(grads) and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
    return bad_loss, bad_grad


class NonFiniteGuard:
    """Check before the optimizer update; ``mode="halt"`` raises, ``mode="skip"`` drops the step.

    Use :meth:`step` in place of ``optimizer.step(); scheduler.step()``. A skipped step does not
    advance the scheduler; the count of skipped steps is saved by the Checkpointer. With an
    enabled GradScaler, gradient overflow is the scaler's business (it lowers the scale and skips);
    only a non-finite loss halts then.
    """

    def __init__(self, model: nn.Module, mode: str = "halt") -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not one of {MODES}")
        self.model = model
        self.mode = mode
        self.skipped = 0
        self.checked = 0

    def check(self, loss: torch.Tensor | None) -> bool:
        """True when this step may update (collective: every rank must call it)."""
        bad_loss, bad_grad = nonfinite_flags(loss, self.model)
        flags = torch.tensor([float(bad_loss), float(bad_grad)], device=collective_device())
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        self.checked += 1
        return not bool(flags.any())

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        loss: torch.Tensor | None = None,
        *,
        scheduler: Any = None,
        scaler: Any = None,
    ) -> bool:
        """Step optimizer (and scheduler) when loss and gradients are finite; return whether it did."""
        scaler_on = scaler is not None and scaler.is_enabled()
        if scaler_on:
            scaler.unscale_(optimizer)
        bad_loss, bad_grad = nonfinite_flags(loss, self.model)
        flags = torch.tensor([float(bad_loss), float(bad_grad and not scaler_on)], device=collective_device())
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        self.checked += 1
        if bool(flags.any()):
            what = "loss" if bool(flags[0]) else "gradients"
            if self.mode == "halt":
                raise NonFiniteError(
                    f"Non-finite {what} at update {self.checked} on at least one rank; the optimizer did not step. "
                    "Lower the learning rate, check the data, or use NonFiniteGuard(mode='skip')."
                )
            self.skipped += 1
            optimizer.zero_grad(set_to_none=True)
            log.warning(
                "guard: non-finite %s, step skipped on every rank (%d skipped so far)", what, self.skipped
            )
            if scaler_on:
                scaler.update()
            return False
        if scaler_on:
            scale_before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            stepped = scaler.get_scale() >= scale_before  # a lowered scale means the scaler skipped
        else:
            optimizer.step()
            stepped = True
        if stepped and scheduler is not None:
            scheduler.step()
        return stepped

    def state_dict(self) -> dict[str, int]:
        """Counters saved with a checkpoint."""
        return {"skipped": self.skipped, "checked": self.checked}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the counters."""
        self.skipped = int(state["skipped"])
        self.checked = int(state["checked"])

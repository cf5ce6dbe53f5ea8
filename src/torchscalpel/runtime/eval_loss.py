"""The evaluation loss of each evaluation pass: ``record.sections["eval"]``.

The runtime already tells evaluation forwards apart (:mod:`~torchscalpel.runtime.hooks`: a root forward
without grad once training is expected). An *evaluation pass* is what runs between two training steps
once such a forward happened; its loss is the mean of the losses torch's loss functions returned under
no grad during the pass. ``torch.nn.functional``'s losses are wrapped for the run: the ``nn.*Loss``
modules call them, and so do Hugging Face models computing their own ``loss`` (what the Trainer's
evaluation reads), so a script's own evaluation code is seen whichever way it is written. A loss
computed by hand (``((pred - y) ** 2).mean()``) is not seen: then the section is absent, never guessed.

Cost: one Python call around each loss call; values stay on the device until the run ends (one read
per pass then: no synchronisation inside the script). ``reduction="sum"`` (the PyTorch MNIST example's
``F.nll_loss(..., reduction="sum")``) is divided by what it summed over, so every pass is a mean.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.runtime.observer import Observer
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr
from torchscalpel.runtime.userframes import user_frame

if TYPE_CHECKING:
    from torchscalpel.record import RunRecord, StepRecord

EVAL = "eval"
"""``record.sections["eval"]``: ``passes`` (``step``: training steps done before the pass, ``loss``, ``batches``:
loss calls averaged), ``functions`` (the loss functions seen) and ``site`` (``file``, ``line``: the user's line of
the first evaluation loss)."""

LOSS_FUNCTIONS = (
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
    "poisson_nll_loss",
    "gaussian_nll_loss",
)
"""``torch.nn.functional`` losses whose value under no grad during an evaluation pass is recorded."""
_CLASS_TARGETS = ("cross_entropy", "nll_loss")
"""Losses whose integer targets may carry an ``ignore_index`` (what a ``sum`` divides by excludes them)."""


@dataclass(slots=True)
class _Pass:
    step: int
    total: Any = None
    batches: int = 0
    functions: set[str] = field(default_factory=set)


class EvalLossObserver(Observer):
    """Records each evaluation pass's mean loss (see the module docstring)."""

    name = "eval-loss"

    def __init__(self) -> None:
        self.session: Any = None
        self.passes: list[_Pass] = []
        self.site: tuple[str, int] | None = None
        self._open: _Pass | None = None
        self._mark = 0
        """``session.eval_forwards`` when training last ran: more since then means an evaluation is under way."""
        self._steps_done = 0
        self._depth = 0
        self._restore: list[Undo] = []

    def on_start(self, session: Any) -> None:
        self.session = session
        import torch.nn.functional as F

        for name in LOSS_FUNCTIONS:
            fn = getattr(F, name, None)
            if fn is not None:
                self._restore.append(wrap_attr(F, name, self._wrap(name, _reduction_index(fn))))

    def _wrap(
        self, name: str, reduction_at: int | None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        observer = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def loss(*args: Any, **kwargs: Any) -> Any:
                if torch.compiler.is_compiling():  # torch.compile traces the loss alone, never us
                    return original(*args, **kwargs)
                out = original(*args, **kwargs)
                # Training losses (grad on) and nested calls cost one check.
                if torch.is_grad_enabled() or observer._depth:
                    return out
                observer._depth += 1
                try:
                    observer._note(name, reduction_at, out, args, kwargs)
                except Exception:  # recording must never change what the script computes
                    pass
                finally:
                    observer._depth -= 1
                return out

            return loss

        return make

    def _note(
        self, name: str, reduction_at: int | None, out: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        s = self.session
        if s is None or s.eval_forwards <= self._mark or not isinstance(out, torch.Tensor):
            return
        reduction = kwargs.get("reduction")
        if reduction is None and reduction_at is not None and len(args) > reduction_at:
            reduction = args[reduction_at]
        value = _mean_value(name, out.detach(), reduction, args, kwargs)
        if value is None:
            return
        if self._open is None:
            self._open = _Pass(step=self._steps_done)
        p = self._open
        p.total = value if p.total is None else p.total + value
        p.batches += 1
        p.functions.add(name)
        if self.site is None:
            frame = user_frame(sys._getframe(2), max_depth=60)
            if frame is not None:
                self.site = (frame.f_code.co_filename, frame.f_lineno)

    def _close(self) -> None:
        if self.session is not None:
            self._mark = self.session.eval_forwards
        if self._open is not None:
            self.passes.append(self._open)
            self._open = None

    def on_backward_pre(self, tensors: tuple[torch.Tensor, ...]) -> None:
        self._close()

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        self._close()

    def on_step_end(self, step: StepRecord) -> None:
        self._steps_done = step.index + 1

    def on_finish(self, record: RunRecord) -> None:
        undo_all(self._restore)()
        self._restore = []
        self._close()
        passes = []
        for p in self.passes:
            try:
                loss = float(p.total) / p.batches
            except (TypeError, ValueError, RuntimeError):
                continue
            passes.append(
                {"step": p.step, "loss": loss if math.isfinite(loss) else None, "batches": p.batches}
            )
        if not passes:
            return
        section: dict[str, Any] = {
            "passes": passes,
            "functions": sorted(set().union(*(p.functions for p in self.passes))),
        }
        if self.site is not None:
            section["site"] = {"file": self.site[0], "line": self.site[1]}
        record.sections[EVAL] = section


def _reduction_index(fn: Callable[..., Any]) -> int | None:
    """Where ``reduction`` sits among ``fn``'s positional parameters (read once, when the run starts)."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("reduction") if "reduction" in names else None


def _mean_value(
    name: str, out: torch.Tensor, reduction: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> torch.Tensor | None:
    """The loss as a mean over what it was computed on, a 0-d float tensor on its device (no sync)."""
    if out.numel() == 0:
        return None
    if reduction != "sum":
        return out.float().mean() if out.dim() else out.float()
    target = args[1] if len(args) > 1 else kwargs.get("target")
    if name in _CLASS_TARGETS and isinstance(target, torch.Tensor) and not target.is_floating_point():
        ignore = kwargs.get("ignore_index", -100)
        count = (target != ignore).sum().clamp(min=1)
    elif isinstance(target, torch.Tensor):
        count = torch.tensor(max(target.numel(), 1), device=out.device)
    else:
        return None
    return out.float() / count

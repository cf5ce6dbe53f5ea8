"""Per-step facts the trackers log that the step timeline does not keep: the learning rate and the
gradient norm the script's own clipping returned."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchscalpel.runtime.observer import Observer
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr

if TYPE_CHECKING:
    import torch

    from torchscalpel.record import RunRecord, StepRecord

STEPS_EXTRA = "steps_extra"
"""``record.sections["steps_extra"]``: per-step series by name (``lr``), each ``{step index: value}``."""


class LearningRateObserver(Observer):
    """The first optimizer's first param group's ``lr`` as each step's optimizer step begins."""

    name = "learning-rate"

    def __init__(self) -> None:
        self.lr: dict[str, float] = {}
        self._first: int | None = None
        self._pending: float | None = None

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if self._first is None:
            self._first = id(optimizer)
        if id(optimizer) != self._first:
            return
        try:
            value: Any = optimizer.param_groups[0]["lr"]
            value = float(value.item() if hasattr(value, "item") else value)  # a tensor lr (capturable Adam)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError):
            return
        self._pending = value

    def on_step_end(self, step: StepRecord) -> None:
        # Keyed when the step closes: forward-delimited steps before the first optimizer step are
        # provisional and renumbered, so an index read at the pre-hook could be off by those.
        if self._pending is not None:
            self.lr[str(step.index)] = self._pending
            self._pending = None

    def on_finish(self, record: RunRecord) -> None:
        if self.lr:
            record.sections.setdefault(STEPS_EXTRA, {})["lr"] = self.lr


class GradNormObserver(Observer):
    """The gradient norm each step's ``clip_grad_norm_`` returned, when the script clips.

    Nothing is computed that the script did not compute: the value is the tensor
    ``torch.nn.utils.clip_grad_norm_`` already returns. On CUDA reading it synchronizes, so the
    tensors are kept and read in batches of :attr:`FLUSH_EVERY` steps (one sync per batch, between
    steps) and at the end, never inside a step.
    """

    name = "grad-norm"
    FLUSH_EVERY = 64

    def __init__(self) -> None:
        self.grad_norm: dict[str, float] = {}
        self._pending: Any = None
        self._unread: list[tuple[str, Any]] = []
        self._restore: list[Undo] = []

    def on_start(self, session: Any) -> None:
        """Wrap ``clip_grad_norm_`` where scripts reach it (``torch.nn.utils`` and its ``clip_grad`` module)."""
        import torch.nn.utils as nn_utils
        import torch.nn.utils.clip_grad as clip_grad

        for owner in (
            clip_grad,
            nn_utils,
        ):  # each wrapped as it is now (another observer may have wrapped one)
            if getattr(owner, "clip_grad_norm_", None) is not None:
                self._restore.append(wrap_attr(owner, "clip_grad_norm_", self._wrap))

    def _wrap(self, original: Any) -> Any:
        observer = self

        def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
            norm = original(*args, **kwargs)
            observer._pending = norm  # the last call in a step wins (one call per step is the norm)
            return norm

        return clip_grad_norm_

    def on_step_end(self, step: StepRecord) -> None:
        if self._pending is None:
            return
        self._unread.append((str(step.index), self._pending))
        self._pending = None
        if len(self._unread) >= self.FLUSH_EVERY or not _on_cuda(self._unread[-1][1]):
            self._read()

    def _read(self) -> None:
        for index, norm in self._unread:
            try:
                value = float(norm.item() if hasattr(norm, "item") else norm)
            except (TypeError, ValueError, RuntimeError):
                continue
            self.grad_norm[index] = value
        self._unread = []

    def on_finish(self, record: RunRecord) -> None:
        undo_all(self._restore)()
        self._restore = []
        self._read()
        if self.grad_norm:
            record.sections.setdefault(STEPS_EXTRA, {})["grad_norm"] = self.grad_norm


def _on_cuda(value: Any) -> bool:
    return bool(getattr(getattr(value, "device", None), "type", "cpu") != "cpu")

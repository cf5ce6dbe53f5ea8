"""Per-step facts the trackers log that the step timeline does not keep: the learning rate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchscalpel.runtime.observer import Observer

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

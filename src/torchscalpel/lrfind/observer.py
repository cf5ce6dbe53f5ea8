"""The range test's runtime side: the swept lr set before every optimizer step, the script's LR
scheduler suspended, each step's loss smoothed and the run stopped once it diverges."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from torchscalpel.lrfind.options import LrOptions
from torchscalpel.lrfind.sweep import Smoother, min_over_10, schedule, suggest
from torchscalpel.runtime.observer import Observer
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr

if TYPE_CHECKING:
    import torch

    from torchscalpel.record import RunRecord, StepRecord
    from torchscalpel.runtime.session import Session

SECTION = "lr"
"""``record.sections["lr"]`` (typed by :class:`torchscalpel.sections.LrSection`)."""


class LrSweepObserver(Observer):
    """Sets every param group's lr to the sweep's value for the step, records the loss per step."""

    name = "lr-sweep"

    def __init__(self, options: LrOptions) -> None:
        self.options = options
        self.lrs = schedule(options.min_lr, options.max_lr, options.steps)
        self.points: list[dict[str, Any]] = []
        self.smoother = Smoother(options.smoothing, options.divergence_factor)
        self.divergence: dict[str, Any] | None = None
        self.scheduler_steps = 0
        """Calls of the script's LR scheduler(s) ``step`` that were suspended."""
        self._session: Session | None = None
        self._sweeps = 0  # optimizer steps of the first optimizer: the sweep's position
        self._first: int | None = None
        self._optimizers: set[int] = set()
        self._groups = 0
        self._pending: float | None = None  # the lr this step's optimizer step ran with
        self._restore: list[Undo] = []
        self._depth = 0

    # ----- the script's scheduler --------------------------------------------------------
    def setup(self) -> Undo:
        """Runtime setup hook: suspend ``step`` of every LR scheduler class torch defines (the base, and
        the four that define their own: ReduceLROnPlateau, CosineAnnealingWarmRestarts, SequentialLR,
        ChainedScheduler), so a LambdaLR (HF Trainer's) or a Lightning scheduler moves nothing."""
        from torch.optim import lr_scheduler

        classes = [lr_scheduler.LRScheduler, *_subclasses(lr_scheduler.LRScheduler)]
        for cls in classes:
            if "step" in vars(cls):
                self._restore.append(wrap_attr(cls, "step", self._suspend))
        return undo_all(self._restore)

    def _suspend(self, original: Any) -> Any:
        observer = self

        def step(scheduler: Any, *args: Any, **kwargs: Any) -> Any:
            # The scheduler's own bookkeeping runs (its counters, get_last_lr(), which HF Trainer logs,
            # stay valid) but every param group is put back as it was: lr, momentum, betas untouched.
            optimizer = getattr(scheduler, "optimizer", None)
            groups = getattr(optimizer, "param_groups", None) or []
            saved = [{k: v for k, v in g.items() if k != "params"} for g in groups]
            observer._depth += 1
            try:
                return original(scheduler, *args, **kwargs)
            finally:
                observer._depth -= 1
                for group, before in zip(groups, saved, strict=False):
                    group.update(before)
                if saved and hasattr(scheduler, "_last_lr"):
                    scheduler._last_lr = [g["lr"] for g in saved]
                # the script's own calls: not the one a scheduler's __init__ takes, not a SequentialLR's inner one
                if observer._depth == 0 and not getattr(scheduler, "_is_initial", False):
                    observer.scheduler_steps += 1

        return step

    # ----- the runtime's events ------------------------------------------------------------
    def on_start(self, session: Session) -> None:
        self._session = session

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if self._first is None:
            self._first = id(optimizer)
        if id(optimizer) == self._first:
            self._pending = self.lrs[min(self._sweeps, len(self.lrs) - 1)]
            self._sweeps += 1
        if self._pending is None:
            return
        if id(optimizer) not in self._optimizers:
            self._optimizers.add(id(optimizer))
            self._groups += len(optimizer.param_groups)
        for group in optimizer.param_groups:
            current: Any = group.get("lr")
            if hasattr(current, "fill_"):  # a tensor lr (capturable / fused optimizers): keep the tensor
                current.fill_(self._pending)
            else:
                group["lr"] = self._pending

    def on_step_end(self, step: StepRecord) -> None:
        lr, self._pending = self._pending, None
        if lr is None or self.divergence is not None:
            return
        loss = step.loss
        if loss is None:
            self.points.append({"step": step.index, "lr": lr, "loss": None, "smoothed": None})
            return
        smoothed, diverged = self.smoother.add(float(loss))
        self.points.append(
            {
                "step": step.index,
                "lr": lr,
                "loss": float(loss) if math.isfinite(loss) else None,
                "smoothed": smoothed if math.isfinite(smoothed) else None,
            }
        )
        if diverged:
            self.divergence = {
                "step": step.index,
                "lr": lr,
                "smoothed": smoothed if math.isfinite(smoothed) else None,
                "min_smoothed": self.smoother.best if math.isfinite(self.smoother.best) else None,
            }
            if self._session is not None:
                self._session.request_stop(f"the smoothed loss diverged at lr {lr:.3g}")

    def on_finish(self, record: RunRecord) -> None:
        undo_all(self._restore)()
        self._restore = []
        record.sections[SECTION] = self.section()

    def section(self) -> dict[str, Any]:
        """``sections["lr"]``: the sweep, every point, the suggestion and the divergence point."""
        kept = [p for p in self.points if p["smoothed"] is not None]
        result = suggest([p["lr"] for p in kept], [p["smoothed"] for p in kept]) if kept else None
        note = ""
        if result is None:
            note = (
                "no suggestion: the script ran no optimizer step with a loss"
                if not kept
                else "no suggestion: too few points, or the smoothed loss never fell; widen --min/--max or add --steps"
            )
        suggestion = None
        if result is not None:
            point = kept[result.index]
            suggestion = {
                "lr": result.lr,
                "step": point["step"],
                "smoothed": point["smoothed"],
                "slope": result.slope,
            }
        # fastai's other rule, printed beside the steepest descent: on the corpus it trains better
        # (BENCHMARKS.md, "Which suggestion trains better").
        minimum = min_over_10([p["lr"] for p in kept], [p["smoothed"] for p in kept]) if kept else None
        tenth = None
        if minimum is not None:
            point = kept[minimum[0]]
            tenth = {
                "lr": minimum[1],
                "step": point["step"],
                "min_lr": point["lr"],
                "smoothed": point["smoothed"],
            }
        return {
            "min_lr": self.options.min_lr,
            "max_lr": self.options.max_lr,
            "steps": self.options.steps,
            "smoothing": self.options.smoothing,
            "divergence_factor": self.options.divergence_factor,
            "points": self.points,
            "suggestion": suggestion,
            "min_over_10": tenth,
            "divergence": self.divergence,
            "optimizers": len(self._optimizers),
            "param_groups": self._groups,
            "scheduler_steps_suspended": self.scheduler_steps,
            "note": note,
        }


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_subclasses(sub))
    return out

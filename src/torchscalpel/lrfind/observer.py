"""The range test's runtime side: the swept lr set before every optimizer step, the script's LR
scheduler suspended, each step's loss smoothed and the run stopped once it diverges."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torchscalpel.lrfind.coverage import coverage, more_steps_advice, short_reason
from torchscalpel.lrfind.options import MIN_STEPS, LrOptions
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

    def __init__(self, options: LrOptions, *, step_flags: Sequence[str] = ()) -> None:
        self.options = options
        self.step_flags = list(step_flags)
        """The script's own arguments that make it train longer (``--epochs``), named when the sweep is short."""
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
        self.script_lrs: list[float] = []
        """Each param group's lr as the script set it, read before the sweep's first write (first seen first)."""
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
                own = _as_float(group.get("lr"))
                if own is not None:
                    self.script_lrs.append(own)
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
                self._session.request_stop(f"the smoothed loss diverged at lr {lr:.3g}", kind="divergence")

    def on_finish(self, record: RunRecord) -> None:
        undo_all(self._restore)()
        self._restore = []
        stop = self._session.stop_reason if self._session is not None else None
        record.sections[SECTION] = self.section(ended=_how_it_ended(record, stop))

    def section(self, *, ended: str | None = None) -> dict[str, Any]:
        """``sections["lr"]``: the sweep, every point, the suggestions and the divergence point.

        The suggestions are read off the curve only when the sweep measured it (:class:`Coverage`: it
        reached ``--max`` or diverged); otherwise both are None and ``not_measured`` says how far the sweep
        got, ``to_measure`` how to give it its steps. ``ended``: how the script ended when it did not end on its
        own (failed, stopped, interrupted: from the record); None when it did."""
        cov = coverage(
            [p["lr"] for p in self.points],
            min_lr=self.options.min_lr,
            max_lr=self.options.max_lr,
            steps=self.options.steps,
            diverged=self.divergence is not None,
        )
        kept = [p for p in self.points if p["smoothed"] is not None]
        not_measured, to_measure, note = None, None, ""
        if not self.points:
            not_measured = self._nothing_swept(ended)
        elif not kept and self.divergence is not None:
            not_measured = (
                f"the loss was not finite from the sweep's first step (lr {self.points[0]['lr']:.3g}): there is no "
                "curve to read; check the script's loss at its own lr, or start lower with --min"
            )
        elif not kept:
            not_measured = (
                f"the optimizer stepped {len(self.points)} time(s) with a swept lr but no loss was seen: the "
                "script called no backward() on a loss before its optimizer steps"
            )
        elif not cov.measured:
            not_measured = short_reason(cov, ended or "the script ended")
            to_measure = more_steps_advice(cov, self.step_flags, min_steps=MIN_STEPS)
        suggestion = tenth = None
        if not_measured is None:
            lrs, smoothed = [p["lr"] for p in kept], [p["smoothed"] for p in kept]
            result = suggest(lrs, smoothed)
            if result is None:
                note = "no suggestion: too few points, or the smoothed loss never fell; widen --min/--max or add --steps"
            else:
                point = kept[result.index]
                suggestion = {
                    "lr": result.lr,
                    "step": point["step"],
                    "smoothed": point["smoothed"],
                    "slope": result.slope,
                }
            # fastai's other rule, printed beside the steepest descent: on the corpus it trains better
            # (BENCHMARKS.md, "Which suggestion trains better").
            minimum = min_over_10(lrs, smoothed)
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
            "steps_run": cov.steps_run,
            "reached_lr": cov.reached_lr,
            "range_share": cov.share,
            "suggestion": suggestion,
            "min_over_10": tenth,
            "not_measured": not_measured,
            "to_measure": to_measure,
            "divergence": self.divergence,
            "optimizers": len(self._optimizers),
            "param_groups": self._groups,
            "script_lrs": list(self.script_lrs),
            "scheduler_steps_suspended": self.scheduler_steps,
            "note": note,
        }

    def _nothing_swept(self, ended: str | None) -> str:
        """Why no point was swept: the script never stepped an optimizer, or ended before its first step."""
        if self._optimizers:  # stepped, but no step closed after it (the script ended inside its first step)
            return f"{ended or 'the script ended'} inside its first optimizer step, before any point was recorded"
        if ended is not None:
            return f"{ended} before its first optimizer step: the sweep never started"
        return (
            "the script never called an optimizer's step(), so no learning rate was swept: scalpel lr sets the lr "
            "of torch.optim optimizers before each step(); train with one (optimizer.step() in the loop), or "
            "check that the script's arguments make it train"
        )


def _how_it_ended(record: RunRecord, stop_reason: str | None) -> str | None:
    """How the script ended when it did not end on its own, as the subject of a sentence (``"the script failed
    (exit code 1: ...)"``); None when it ran to its end. ``stop_reason``: why the runtime stopped it, if it did."""
    if record.status == "failed":
        error = f": {record.error}" if record.error else ""
        return f"the script failed (exit code {record.exit_code}{error})"
    if record.status == "interrupted":
        return "the run was interrupted"
    if record.status == "stopped" and stop_reason:
        return f"the run was stopped ({stop_reason})"
    return None


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_subclasses(sub))
    return out


def _as_float(value: Any) -> float | None:
    """A param group's lr (a number or a one-element tensor) as a finite float, else None."""
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if math.isfinite(number) and number >= 0 else None

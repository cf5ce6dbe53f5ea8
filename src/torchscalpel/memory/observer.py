"""The memory observer: runs the allocation tracker over a script and tells it who owns what.

The runtime's events give ownership: a root forward names the model's submodules and adopts its
parameters and buffers; each parameter's post-accumulate-grad hook marks its ``.grad`` as a gradient the
moment autograd writes it; the optimizer's step adopts its state; the loss passed to backward is marked
(a loss kept across steps keeps its graph's saved activations alive). At every step end the observer
keeps a sample (live total, step peak, categories, the largest sites) for the timeline and the growth
analysis. At the end it stores ``record.sections["memory"]``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from torchscalpel.runtime.alloc_tracker import AllocationTracker
from torchscalpel.runtime.memory_categories import BEFORE_TRAINING, EVALUATION
from torchscalpel.runtime.observer import Observer

SITES_PER_SAMPLE = 30
"""Largest call sites kept at each step end (growth analysis reads these)."""


COMPILED_NOTE = (
    "the model is torch.compile'd but ran eagerly under the memory tracker (dynamo runs no compiled code while a "
    "tensor-tracking dispatch mode is active): these figures are the eager model's memory; the compiled model's "
    "saved activations and temporaries can be smaller (measure it with 'scalpel profile', allocator peak)"
)
"""``sections["memory"]["compiled"]``: said when the root model was compiled, never a compiled figure passed off."""


def _is_compiled(module: torch.nn.Module) -> bool:
    """``torch.compile(model)`` (an OptimizedModule) or ``model.compile()`` (a compiled ``_call_impl``)."""
    import sys

    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # only loaded when something was compiled
    optimized = getattr(eval_frame, "OptimizedModule", None)
    if optimized is not None and isinstance(module, optimized):
        return True
    return getattr(module, "_compiled_call_impl", None) is not None


class MemoryObserver(Observer):
    """Tensor-level accounting over the run, optionally under a hard ``limit`` in bytes."""

    name = "memory"

    def __init__(self, *, limit: int | None = None, plan: bool = True, until_eval: int | None = None) -> None:
        self.limit = limit
        self.until_eval = until_eval
        """``--until-eval``: steps to run at least (warm-up included), then stop once an evaluation has ended
        (None: the runtime's own window decides)."""
        self.evaluations = 0
        """Evaluation passes entered (a root forward of a model without grad after anything else)."""
        self._eval_ended = False
        self.bounded_state: dict[str, Any] | None = None
        """An optimizer whose state grows to a known cap (LBFGS's history), as of its last step (lbfgs_bound)."""
        self._steps_done = 0
        self.tracker: AllocationTracker | None = None
        self.samples: list[dict[str, Any]] = []
        self.session: Any = None
        self._models: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._grad_handles: list[Any] = []
        self._step_peak = 0
        self.plan_observer: Any = None
        if plan:
            from torchscalpel.memory.ladder import LadderPlanObserver

            self.plan_observer = LadderPlanObserver()
        self.cuda_history = False
        self.before_training: dict[str, Any] | None = None
        """The peak breakdown before the model's first training forward (data loading, model building)."""
        self._trained = False
        self._in_step = False
        """Inside optimizer.step(): a closure's backward returns to the step's own update."""
        self._stepped = False
        self.compiled: str | None = None
        """The root model is ``torch.compile``'d (its class name): it ran eagerly under the tracker, see on_finish."""
        """An optimizer step ran since the last step end (that step end commits the step, see committed_step)."""

    # ----- events -------------------------------------------------------------------------
    def on_start(self, session: Any) -> None:
        self.session = session
        device_kind = "cuda" if torch.cuda.is_available() else "cpu"
        self.tracker = AllocationTracker(limit=self.limit, device_kind=device_kind)
        # Until the model's first training forward the script is loading data or building things: a peak
        # there (a dataset materialised as tensors) is reported as such, not as step 0's forward.
        self.tracker.phase = BEFORE_TRAINING
        if device_kind == "cuda":
            self.cuda_history = _start_cuda_history()
        if self.plan_observer is not None:
            self.plan_observer.on_start(session)
        self.tracker.start()

    def on_batch(self, batch: Any, loader: Any) -> None:
        if self.plan_observer is not None:
            self.plan_observer.on_batch(batch, loader)

    def on_forward_pre(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], root: bool
    ) -> None:
        if self.plan_observer is not None:
            self.plan_observer.on_forward_pre(module, args, kwargs, root)
        if not root or self.tracker is None:
            return
        tr = self.tracker
        if not torch.is_grad_enabled():
            # An evaluation forward (nanoGPT's estimate_loss before the first step): not data preparation, so an
            # out-of-memory in it is not blamed on the data (a loss module has no parameters: not a model)
            if any(True for _ in module.parameters()):
                if tr.phase != EVALUATION:
                    self.evaluations += 1
                tr.phase = EVALUATION
            return
        if tr.phase == EVALUATION and self.evaluations:  # training again: the evaluation pass is over
            self._eval_ended = True
            self._stop_after_evaluation()
        if not self._trained:  # the first training forward: the breakdown is of the training peak
            # (a flag, not the phase: Lightning's optimizer.step(closure) runs the first forward inside the step)
            self._trained = True
            self.before_training = tr.restart_peak()
        tr.phase = "forward"
        if self.compiled is None and _is_compiled(module):
            self.compiled = type(module).__name__
        if module not in self._models:
            self._models.add(module)
            tr.name_modules(module)
            tr.adopt(module.parameters(), "parameters")
            tr.adopt(module.buffers(), "parameters")
            tr.adopt((p.grad for p in module.parameters() if p.grad is not None), "gradients")
            for p in module.parameters():
                if p.requires_grad:
                    self._grad_handles.append(p.register_post_accumulate_grad_hook(self._grad_written))

    def _grad_written(self, p: torch.Tensor) -> None:
        if self.tracker is not None and p.grad is not None:
            self.tracker.recategorize(p.grad, "gradients")

    def on_backward_pre(self, tensors: tuple[torch.Tensor, ...]) -> None:
        if self.plan_observer is not None:
            self.plan_observer.on_backward_pre(tensors)
        if self.tracker is not None:
            self.tracker.phase = "backward"
            for t in tensors:
                self.tracker.mark_loss(t)

    def on_backward_post(self, tensors: tuple[torch.Tensor, ...]) -> None:
        if self.tracker is not None:
            self.tracker.phase = "optimizer" if self._in_step else "after backward"
            self.tracker.accumulating = True

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        self._in_step = True
        if self.plan_observer is not None:
            self.plan_observer.on_optimizer_step_pre(optimizer)
        if self.tracker is not None:
            self.tracker.phase = "optimizer"

    def on_optimizer_step_post(self, optimizer: torch.optim.Optimizer) -> None:
        self._in_step = False
        self._stepped = True
        if self.plan_observer is not None:
            self.plan_observer.on_optimizer_step_post(optimizer)
        if self.tracker is None:
            return
        tr = self.tracker
        tr.phase = "after optimizer"
        tr.accumulating = False
        if isinstance(optimizer, torch.optim.LBFGS):
            self.bounded_state = lbfgs_bound(optimizer)
        state = [v for s in optimizer.state.values() if isinstance(s, dict) for v in s.values()]
        tr.adopt((v for v in state if isinstance(v, torch.Tensor) and v.dim() > 0), "optimizer_state")
        # Anything else the step left behind (a foreach temporary still referenced) stays a temporary.

    def on_step_end(self, step: Any) -> None:
        tr = self.tracker
        if tr is None:
            return
        top = sorted(tr.by_site.items(), key=lambda kv: kv[1], reverse=True)[:SITES_PER_SAMPLE]
        kept = sum(a.nbytes for a in tr.live.values() if a.category == "activations" and a.step < tr.step)
        # Provisional steps (forward- or backward-delimited before the first optimizer step) are merged
        # by the timeline: a step index seen again replaces what was sampled from it onwards.
        self.samples = [s for s in self.samples if s["step"] < step.index]
        self.samples.append(
            {
                "step": step.index,
                "warmup": bool(step.warmup),
                "live": tr.total,
                "peak": max(tr.step_peak, tr.total),
                "by_category": dict(tr.by_category),
                "sites": dict(top),
                "kept_activations": kept,
                "losses_kept": sum(1 for a in tr.live.values() if a.is_loss and a.step < tr.step),
            }
        )
        tr.step = step.index + 1
        self._steps_done = step.index + 1
        self._stop_after_evaluation()
        if self._stepped:  # a step that an optimizer step ended (not a provisional forward/backward one)
            tr.committed_step, self._stepped = tr.step, False
        tr.step_peak = tr.total

    def _stop_after_evaluation(self) -> None:
        """Under ``--until-eval``: end the run at the next step boundary once the window's steps ran and an
        evaluation pass (mnist's test loop after each epoch, with a larger batch) was measured to its end."""
        if (
            self.until_eval is not None
            and self._eval_ended
            and self._steps_done >= self.until_eval
            and self.session is not None
        ):
            self.session.request_stop(
                "scalpel memory: the window's steps and one evaluation were measured", kind="steps"
            )

    def on_finish(self, record: Any) -> None:
        if self.plan_observer is not None:
            self.plan_observer.on_finish(record)
        tr = self.tracker
        if tr is None:
            return
        tr.stop()
        for h in self._grad_handles:
            h.remove()
        self._grad_handles = []
        from torchscalpel.memory.analysis import build_section, oom_measured, write_snapshot

        snapshot: dict[str, str] = {}
        if tr.oom is not None:  # written first: a crash in the analysis below keeps it
            try:
                snapshot = write_snapshot(self, tr.oom)
            except Exception as exc:
                snapshot = {"error": repr(exc)}
        try:
            record.sections["memory"] = build_section(self, record, snapshot)
            if self.compiled is not None:
                record.sections["memory"]["compiled"] = COMPILED_NOTE
        except Exception as exc:  # a crash in the analysis keeps what was measured
            import traceback

            record.sections["memory"] = {
                "version": "1.0",
                "error": f"analysis failed: {exc!r}",
                "traceback": traceback.format_exc(limit=6),
                "peak": {"total": tr.peak, **(tr.peak_copy or {})},
                "oom": None if tr.oom is None else oom_measured(tr.oom),
                "snapshot": snapshot,
                "samples": self.samples,
            }


def lbfgs_bound(optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """LBFGS's state cap: ``history_size`` pairs of flat parameter-sized vectors (``old_dirs``, ``old_stps``) plus
    the direction and the previous flat gradient; and how many pairs it holds now. None without parameters."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if not params:
        return None
    history = int(optimizer.param_groups[0].get("history_size", 0))
    state = optimizer.state.get(params[0]) or {}
    vector = sum(p.numel() for p in params) * params[0].element_size()
    return {
        "optimizer": type(optimizer).__name__,
        "history_size": history,
        "pairs": len(state.get("old_dirs") or []),
        "cap": (2 * history + 2) * vector,
    }


def _start_cuda_history() -> bool:
    """Record allocator history on CUDA so an out-of-memory can dump ``torch.cuda.memory`` snapshot."""
    try:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        return True
    except Exception:
        return False

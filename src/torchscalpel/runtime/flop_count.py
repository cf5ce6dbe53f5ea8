"""FLOPs per training step, counted by one dispatch mode over one dedicated step.

torch.profiler's ``with_flops`` counts are not a step's FLOPs: it counts an op and the op it
dispatches to (``aten::conv2d`` and ``aten::convolution`` both, so an autocast run doubles the
forward) and counts no backward op at all. This module counts what
:class:`torch.utils.flop_counter.FlopCounterMode` counts, with the same formulas
(``torch.utils.flop_counter.flop_registry``) and the same dispatch rules, over one whole step
(data, forward, backward, optimizer), and keeps checkpoint recomputation apart: a forward op that
runs inside backward with grad enabled is recomputation, counted once as ``recompute`` and not as
model FLOPs.

The counting step runs every op through Python, so it is slow: it is marked ``profiled`` (and
``flops_counted``) and left out of the timing summary like the profiler window's steps. Under
``torch.compile`` dynamo does not trace frames while a dispatch mode is active, so the counted
step runs the model eagerly: the same arithmetic, counted op by op (the compiled code is used again
from the next step).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from torchscalpel.record import StepRecord

if TYPE_CHECKING:
    from torchscalpel.runtime.session import Session

_aten = torch.ops.aten
# Metadata queries FlopCounterMode declines (it returns NotImplemented for them), kept equal.
_SKIP = {
    _aten.sym_is_contiguous.default, _aten.is_contiguous.default, _aten.is_contiguous.memory_format,
    _aten.is_strides_like_format.default, _aten.is_non_overlapping_and_dense.default, _aten.size.default,
    _aten.sym_size.default, _aten.stride.default, _aten.sym_stride.default, _aten.storage_offset.default,
    _aten.sym_storage_offset.default, _aten.numel.default, _aten.sym_numel.default, _aten.dim.default,
    torch.ops.prim.layout.default,
}


def _recomputing() -> bool:
    """True inside backward with grad enabled: a checkpointed forward being recomputed.

    Backward formulas run with grad disabled (unless ``create_graph=True``); both checkpoint
    styles re-run the forward under ``torch.enable_grad()`` from inside the autograd engine.
    """
    return torch._C._current_graph_task_id() != -1 and torch.is_grad_enabled()


class FlopCountMode(TorchDispatchMode):
    """Counts FLOPs per aten op, model and recompute apart (the formulas of FlopCounterMode)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: dict[str, int] = defaultdict(int)
        self.recompute: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _SKIP or isinstance(func, torch._ops.HigherOrderOperator):
            return NotImplemented
        packet = func._overloadpacket
        # FlopCounterMode decomposes an op it has no formula for (so a composite op's matmuls count).
        if packet not in flop_registry and func is not torch.ops.prim.device.default:
            with self:
                r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
        out = func(*args, **kwargs)
        formula = flop_registry.get(packet)
        if formula is not None:
            n = int(formula(*args, **kwargs, out_val=out))
            name = packet._qualified_op_name  # "aten::mm", the profiler's spelling (the op table joins on it)
            (self.recompute if _recomputing() else self.flops)[name] += n
            self.calls[name] += 1
        return out

    def by_op(self) -> list[dict[str, Any]]:
        """Every op that counted: ``name``, ``count`` (calls), ``flops`` (model), ``recompute``; most first."""
        names = set(self.flops) | set(self.recompute)
        rows = [{"name": n, "count": self.calls[n], "flops": self.flops.get(n, 0), "recompute": self.recompute.get(n, 0)}
                for n in names]
        return sorted(rows, key=lambda d: (-d["flops"], -d["recompute"], d["name"]))


class StepFlopCounter:
    """Counts one settled training step's FLOPs: the first step after the profiler window.

    ``first`` is where counting may start; the counted step is the first settled step at or after
    it that the window does not cover. Restarted with the window when a stronger step kind appears.
    """

    def __init__(self, session: Session, first: int, last: int | None) -> None:
        self.session = session
        self.first = first
        self.last = last
        """The last step index the run will have (None: unknown, the script decides)."""
        self._mode: FlopCountMode | None = None
        self._step: int | None = None
        self._result: dict[str, Any] = {}
        self._reason: str | None = None

    def on_step_closed(self, step: StepRecord, *, window_open: bool) -> None:
        """Called at each settled step end, after the profiler window saw it."""
        if self._mode is not None:
            self._finish(step)
            return
        if self._result or self._reason:
            return
        nxt = step.index + 1
        if nxt >= self.first and not window_open and (self.last is None or nxt <= self.last):
            self._start(nxt)

    def _start(self, index: int) -> None:
        self._mode, self._step = FlopCountMode(), index
        try:
            self._mode.__enter__()
        except Exception as exc:
            self._mode, self._reason = None, f"the FLOP counter failed to start: {exc!r}"

    def _stop(self) -> FlopCountMode | None:
        mode, self._mode = self._mode, None
        if mode is None:
            return None
        try:
            mode.__exit__(None, None, None)
        except Exception as exc:  # another mode left on top of ours: say so rather than guess
            self._reason = f"the FLOP counter could not be removed cleanly: {exc!r}"
            return None
        return mode

    def _finish(self, step: StepRecord) -> None:
        mode = self._stop()
        step.profiled = True
        step.flops_counted = True
        if mode is None:
            return
        ops = mode.by_op()
        self._result = {
            "flops_step": step.index,
            "flops_total": sum(o["flops"] for o in ops),
            "flops_recompute": sum(o["recompute"] for o in ops),
            "flops_by_op": ops,
        }

    def restart(self) -> None:
        """Forget a count made on steps a stronger step kind merged away."""
        self._stop()
        self._result, self._reason, self._step = {}, None, None

    def close(self) -> None:
        """The run ended: a step still being counted was cut short and counts for nothing."""
        if self._mode is not None:
            self._stop()
            self._reason = self._reason or f"the script ended during step {self._step}, the FLOP-counting step"

    def result(self) -> dict[str, Any]:
        """The FLOP keys of the record's ``profiler`` section, or the reason they are missing."""
        if self._result:
            return dict(self._result)
        reason = self._reason
        if reason is None:
            if self.last is not None and self.first > self.last:
                reason = "no measured step was left for counting after the profiler window; add one to --steps"
            else:
                reason = "the script ended before the FLOP-counting step"
        return {"flops_not_measured": reason}

"""FLOPs per training step, counted by one dispatch mode over one dedicated step.

torch.profiler's ``with_flops`` counts are not a step's FLOPs: it counts an op and the op it
dispatches to (``aten::conv2d`` and ``aten::convolution`` both, so an autocast run doubles the
forward) and counts no backward op at all. This module counts what
:class:`torch.utils.flop_counter.FlopCounterMode` counts, with the same formulas
(``torch.utils.flop_counter.flop_registry``) and the same dispatch rules, over one whole step
(data, forward, backward, optimizer), and keeps checkpoint recomputation apart: a forward op that
runs inside backward with grad enabled is recomputation, counted once as ``recompute`` and not as
model FLOPs. An evaluation forward that runs inside the counted window (a ``test()`` between two
training steps: a root forward without grad once training is expected, what the runtime never takes for
a step) is counted apart as ``eval``, never as the step's. The fused recurrent kernels torch has no
formula for (``aten::mkldnn_rnn_layer``, ``aten::_cudnn_rnn``) count by
:mod:`~torchscalpel.runtime.rnn_flops`, CPU's fused attention by :mod:`~torchscalpel.runtime.attention_flops`.

The counting step runs every op through Python, so it is slow: it is marked ``profiled`` (and
``flops_counted``) and left out of the timing summary like the profiler window's steps. Under
``torch.compile`` the counted step runs the model eagerly (the same arithmetic, counted op by op),
with dynamo set aside by the ``force_eager`` stance for that step only
(:func:`~torchscalpel.runtime.dynamo_skip.force_eager` says why: without it the rest of the run,
profiler window included, ran eagerly).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from torchscalpel.record import StepRecord
from torchscalpel.runtime.attention_flops import ATTENTION_FORMULAS
from torchscalpel.runtime.dynamo_skip import force_eager
from torchscalpel.runtime.rnn_flops import RECURRENT_FORMULAS

_aten = torch.ops.aten
# Metadata queries FlopCounterMode declines (it returns NotImplemented for them), kept equal.
_SKIP = {
    _aten.sym_is_contiguous.default,
    _aten.is_contiguous.default,
    _aten.is_contiguous.memory_format,
    _aten.is_strides_like_format.default,
    _aten.is_non_overlapping_and_dense.default,
    _aten.size.default,
    _aten.sym_size.default,
    _aten.stride.default,
    _aten.sym_stride.default,
    _aten.storage_offset.default,
    _aten.sym_storage_offset.default,
    _aten.numel.default,
    _aten.sym_numel.default,
    _aten.dim.default,
    torch.ops.prim.layout.default,
}


def _recomputing() -> bool:
    """True inside backward with grad enabled: a checkpointed forward being recomputed.

    Backward formulas run with grad disabled (unless ``create_graph=True``); both checkpoint
    styles re-run the forward under ``torch.enable_grad()`` from inside the autograd engine.
    """
    return torch._C._current_graph_task_id() != -1 and torch.is_grad_enabled()


_COMPOSITE: dict[Any, bool] = {}


def _composite(func: Any) -> bool:
    """Whether ``func`` has a composite kernel ``decompose`` could use (cached per overload)."""
    known = _COMPOSITE.get(func)
    if known is None:
        keys = (
            torch._C.DispatchKey.CompositeImplicitAutograd,
            torch._C.DispatchKey.CompositeImplicitAutogradNestedTensor,
        )
        known = _COMPOSITE[func] = any(func.has_kernel_for_dispatch_key(k) for k in keys)
    return known


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``t``'s shape, strides and dtype: what a FLOP formula reads, with no data."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta", requires_grad=False)


def formula_for(packet: Any) -> Callable[..., Any] | None:
    """The FLOP formula of an op overload packet: FlopCounterMode's, else a fused recurrent or CPU attention
    kernel's (:mod:`~torchscalpel.runtime.rnn_flops`, :mod:`~torchscalpel.runtime.attention_flops`); None: none."""
    return flop_registry.get(packet) or RECURRENT_FORMULAS.get(packet) or ATTENTION_FORMULAS.get(packet)


class FlopCountMode(TorchDispatchMode):
    """Counts FLOPs per aten op, model, recompute and evaluation apart (the formulas of FlopCounterMode).

    ``evaluating``: asked at each counted op; True while an evaluation forward runs (its FLOPs go to
    :attr:`evaluation`, never to the model's)."""

    def __init__(self, evaluating: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.flops: dict[str, int] = defaultdict(int)
        self.recompute: dict[str, int] = defaultdict(int)
        self.evaluation: dict[str, int] = defaultdict(int)
        """FLOPs of evaluation forwards that ran while counting (not the step's)."""
        self._evaluating = evaluating
        self.unformulated: dict[str, int] = defaultdict(int)
        """Calls of the step's ops that have no FLOP formula and no decomposition to count (model ops only)."""
        self.calls: dict[str, int] = defaultdict(int)
        self.ops = 0
        """Every op dispatched (the profiler window's size estimate)."""
        self._shadow = False
        """True while a composite op's decomposition runs on meta copies, counted and not executed."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _SKIP or isinstance(func, torch._ops.HigherOrderOperator):
            return NotImplemented
        packet = func._overloadpacket
        formula = formula_for(packet)
        decomposable = formula is None and func is not torch.ops.prim.device.default and _composite(func)
        if self._shadow:  # on meta copies: decompose all the way down, as FlopCounterMode does
            if decomposable:
                with self:
                    r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
        else:
            self.ops += 1
            # FlopCounterMode decomposes an op it has no formula for (so a composite op's matmuls count)
            # and returns what the decomposition computed. That changes the step's numerics: the fused
            # kernel and its decomposition round differently (silu_backward on a Xeon with AMX moved a
            # transformers Llama's gradients by an ulp, and every later loss with them). So the
            # decomposition only runs on meta copies of the arguments, to count; the real kernel computes.
            # Only composite ops can decompose, and asking every op costs more than the op (LSTM loops).
            if decomposable:
                self._count_decomposition(func, args, kwargs)
            elif formula is None and not _recomputing() and not (self._evaluating and self._evaluating()):
                self.unformulated[packet._qualified_op_name] += 1
        out = func(*args, **kwargs)
        if formula is not None:
            n = int(formula(*args, **kwargs, out_val=out))
            name = packet._qualified_op_name  # "aten::mm", the profiler's spelling (the op table joins on it)
            if _recomputing():
                self.recompute[name] += n
            elif self._evaluating is not None and self._evaluating():
                self.evaluation[name] += n
                return out
            else:
                self.flops[name] += n
            self.calls[name] += 1
        return out

    def _count_decomposition(self, func: Any, args: Any, kwargs: Any) -> None:
        """Count the FLOPs of ``func``'s composite decomposition, run on meta tensors of the same layout.

        A decomposition that cannot run on meta (data-dependent, a tensor subclass) counts nothing: the
        op's own kernel is what the step runs either way.
        """
        meta_args, meta_kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, _meta_like, (args, kwargs))
        self._shadow = True
        try:
            with self:
                func.decompose(*meta_args, **meta_kwargs)
        except Exception:
            pass
        finally:
            self._shadow = False

    def by_op(self) -> list[dict[str, Any]]:
        """Every op that counted: ``name``, ``count`` (calls), ``flops`` (model), ``recompute``; most first."""
        names = set(self.flops) | set(self.recompute)
        rows = [
            {
                "name": n,
                "count": self.calls[n],
                "flops": self.flops.get(n, 0),
                "recompute": self.recompute.get(n, 0),
            }
            for n in names
        ]
        return sorted(rows, key=lambda d: (-d["flops"], -d["recompute"], d["name"]))


# What may do matmul-like work though it has no formula: an op of the matmul, convolution or attention
# category, one whose name says so (recurrent, sparse, quantized or packed kernels), or an op outside aten
# (a custom kernel). Pooling, activations, norms, copies and the like do not count by FlopCounterMode's
# convention; views, syncs, random fills and resampling do no arithmetic worth the name.
_MATMUL_CATEGORIES = frozenset({"matmul", "conv", "attention"})
_MATMUL_LIKE = re.compile(
    r"rnn|lstm|gru|sparse|mm\b|mm_|gemm|linear|conv|attention|einsum|packed|_weight_int|quantized|qlinear|fbgemm",
    re.IGNORECASE,
)
_NO_ARITHMETIC = re.compile(
    r"^aten::(_local_scalar_dense|item|_?unsafe_view|view\w*|t|detach\w*|lift_fresh\w*|alias|set_|as_strided\w*|"
    r"expand\w*|slice\w*|select\w*|unsqueeze\w*|squeeze\w*|split\w*|chunk|reshape\w*|narrow\w*|unbind|"
    r"permute|transpose\w*|randperm|bernoulli_?|uniform_|normal_|random_|native_dropout\w*|empty\w*|"
    r"resize_|new_\w+|_to_copy|clone|contiguous|_reshape_alias|_?upsample\w*|grid_sampler\w*)$"
)
UNFORMULATED_KEPT = 64
"""At most this many op names kept in ``profiler.flops_unformulated`` (most called first)."""


def may_hold_flops(calls: dict[str, int]) -> list[str]:
    """The op names of ``calls`` that have no formula yet may do matmul-like work (a matmul, convolution or
    attention op, a recurrent, sparse, quantized or packed kernel, a custom op outside aten), not a view, sync or
    random fill; most called first. Pooling, activations, norms and copies have no FLOPs by convention."""
    from torchscalpel.trace.categories import categorize

    names = [
        n
        for n in calls
        if (
            categorize(n) in _MATMUL_CATEGORIES
            or _MATMUL_LIKE.search(n)
            or not n.startswith(("aten::", "prim::"))
        )
        and not _NO_ARITHMETIC.match(n)
    ]
    return sorted(names, key=lambda n: (-calls[n], n))[:UNFORMULATED_KEPT]


class StepFlopCounter:
    """Counts the FLOPs of one settled training step, ``index`` (None: no step is left for it).

    The profiler window sizes itself from what this step saw (:attr:`ops`, the aten ops it
    dispatched, and the forward/backward ends in it), so the counting step comes before the window.
    """

    def __init__(
        self, index: int | None, reason: str | None = None, evaluating: Callable[[], bool] | None = None
    ) -> None:
        self.index = index
        self._evaluating = evaluating
        """True while an evaluation forward runs (the session's hooks know): its FLOPs are kept apart."""
        self._mode: FlopCountMode | None = None
        self._stance: Any = None
        """The ``force_eager`` stance set while counting (restored at the end), None when not set."""
        self._result: dict[str, Any] = {}
        self._reason = reason if index is None else None
        self.ops: int | None = None
        """Aten ops the counted step dispatched (after it ended)."""
        self.boundaries = 0
        """Root forward and backward ends seen while counting (the window cuts a step at one of these)."""
        if index == 0:
            self._start()

    @property
    def counting(self) -> bool:
        """True while the counting step runs."""
        return self._mode is not None

    def on_step_closed(self, step: StepRecord) -> None:
        """Called at each settled step end: finish the counted step, or start it next."""
        if self._mode is not None:
            if step.index == self.index:
                self._finish(step)
            return
        if (
            not self._result
            and self._reason is None
            and self.index is not None
            and step.index + 1 == self.index
        ):
            self._start()

    def _start(self) -> None:
        self._mode, self.boundaries = FlopCountMode(self._evaluating), 0
        self._stance = force_eager()
        try:
            self._mode.__enter__()
        except Exception as exc:
            self._mode, self._reason = None, f"the FLOP counter failed to start: {exc!r}"
            self._restore_stance()

    def _stop(self) -> FlopCountMode | None:
        mode, self._mode = self._mode, None
        self._restore_stance()
        if mode is None:
            return None
        try:
            mode.__exit__(None, None, None)
        except Exception as exc:  # another mode left on top of ours: say so rather than guess
            self._reason = f"the FLOP counter could not be removed cleanly: {exc!r}"
            return None
        return mode

    def _restore_stance(self) -> None:
        stance, self._stance = self._stance, None
        if stance is not None:
            stance.__exit__(None, None, None)

    def _finish(self, step: StepRecord) -> None:
        mode = self._stop()
        step.profiled = True
        step.flops_counted = True
        if mode is None:
            return
        ops = mode.by_op()
        self.ops = mode.ops
        self._result = {
            "flops_step": step.index,
            "flops_total": sum(o["flops"] for o in ops),
            "flops_recompute": sum(o["recompute"] for o in ops),
            "flops_by_op": ops,
        }
        evaluation = sum(mode.evaluation.values())
        if evaluation:
            self._result["flops_eval"] = evaluation
        unformulated = may_hold_flops(mode.unformulated)
        if unformulated:
            self._result["flops_unformulated"] = unformulated

    def restart(self) -> None:
        """Forget a count made on steps a stronger step kind merged away, and arm again."""
        self._stop()
        self._result, self.ops = {}, None
        if self.index is not None:
            self._reason = None
            if self.index == 0:
                self._start()

    def close(self) -> None:
        """The run ended: a step still being counted was cut short and counts for nothing."""
        if self._mode is not None:
            self._stop()
            self._reason = (
                self._reason or f"the script ended during step {self.index}, the FLOP-counting step"
            )

    def result(self) -> dict[str, Any]:
        """The FLOP keys of the record's ``profiler`` section, or the reason they are missing."""
        if self._result:
            return dict(self._result)
        return {
            "flops_not_measured": self._reason
            or f"the script ended before step {self.index}, the FLOP-counting step"
        }

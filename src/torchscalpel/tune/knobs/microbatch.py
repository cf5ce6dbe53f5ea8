"""Micro-batching knob: split each batch into K micro-batches with gradient accumulation, no code change.

The script calls ``loss = crit(model(x), y); loss.backward()`` on the whole batch. With ``microbatches
= K`` the model's call splits every input whose first dimension is the batch into K near-equal chunks
(sizes differ by at most one: a batch of 10 in 4 is 3, 3, 2, 2; a batch smaller than K is split into
one-sample chunks, so no chunk is larger than a full batch's ``ceil(batch / K)``) and
runs each chunk's forward under non-reentrant checkpointing; the outputs are concatenated back into the
batch the script expects. Only the chunk inputs are kept for backward, which recomputes one chunk at a
time: activation memory is that of one micro-batch. Gradients accumulate over the chunks inside the one
backward, and the loss is the script's own loss of the whole batch, so its scaling (a mean over the
batch) is exactly the unsplit one: the gradients equal the unsplit batch's up to summation order.

Outputs: tensors with a batch dimension are concatenated; 0-d floating outputs (a loss computed inside
the model) are the chunk-size-weighted mean, so unequal chunks (an epoch's last, smaller batch) still give
the whole batch's loss and gradients; tuples, lists and dicts of those are combined entry by
entry; a transformers key/value cache (``past_key_values`` of a model whose config has ``use_cache``)
becomes None. A model whose inputs have no batch dimension (or a batch of one) runs unsplit (logged). Combined with
``checkpointing = "blocks"`` each block is checkpointed inside each micro-batch (the least memory of all).

BatchNorm: a model with a BatchNorm (or an InstanceNorm that tracks running statistics) in training mode
runs unsplit, with the reason logged. Each micro-batch would be normalised by its own statistics, so the
loss and gradients would no longer be the whole batch's (the knob promises exact numerics), and the
running statistics would be updated once per micro-batch and again by its recompute. The memory ladder
says so instead of offering the rung (:func:`batch_statistics_modules` is the one test for both).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchscalpel.tune.knobs.base import EXACT, ApplyLog, Knob, SetupHook, Undo
from torchscalpel.tune.knobs.checkpointing import MEMORY_ONLY
from torchscalpel.tune.settings import TuneSettings

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts


class MicrobatchKnob(Knob):
    """``microbatches = K``."""

    name = "microbatch"
    numerics = EXACT
    description = "split each batch into K micro-batches with gradient accumulation"

    def is_set(self, settings: TuneSettings) -> bool:
        return settings.microbatches is not None

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        return [], MEMORY_ONLY

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        if settings.microbatches is None:
            return None
        k = settings.microbatches
        return lambda: install_microbatching(k, log)

    def code_lines(self, settings: TuneSettings) -> list[str]:
        k = settings.microbatches
        if k is None:
            return []
        # tensor_split gives k near-equal chunks of any batch (chunk gives fewer for 10 rows in 4), and each
        # chunk's mean loss is weighted by its share of the batch: the full batch's gradient, last batch included.
        return [
            "optimizer.zero_grad()",
            f"for xb, yb in zip(x.tensor_split({k}), y.tensor_split({k})):",
            "    (loss_fn(model(xb), yb) * len(xb) / len(x)).backward()  # weighted by chunk size",
            "optimizer.step()",
        ]


def batch_statistics_modules(model: nn.Module) -> list[nn.Module]:
    """The submodules of ``model`` that normalise by, or keep running, statistics over the batch when training.

    BatchNorm (1d/2d/3d, lazy, SyncBatchNorm) uses the batch's statistics in training mode; an InstanceNorm
    with ``track_running_stats`` updates its running statistics from every call. Splitting the batch changes
    both. The caller checks ``.training`` (a model can switch modes between calls).
    """
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.instancenorm import _InstanceNorm

    return [
        m
        for m in model.modules()
        if isinstance(m, _BatchNorm) or (isinstance(m, _InstanceNorm) and m.track_running_stats)
    ]


def batchnorm_reason(model: nn.Module, modules: list[nn.Module]) -> str | None:
    """Why ``model`` must not be split now (its batch-statistics modules that are training), or None."""
    training = [m for m in modules if m.training]
    if not training:
        return None
    from torchscalpel.runtime.module_names import display_name

    names = {m: n for n, m in model.named_modules()}
    first = training[0]
    label = display_name(
        names.get(first, "?"), first, type(model).__name__
    )  # the memory report's module names
    if not label.endswith(")"):
        label += f" ({type(first).__name__})"
    more = f" and {len(training) - 1} more" if len(training) > 1 else ""
    return (
        f"{type(model).__name__} has {label}{more} in training mode: "
        "micro-batches would each be normalised by their own statistics (a different loss and gradients) and "
        "update its running statistics once per micro-batch; ran unsplit (a GroupNorm/LayerNorm model, or a "
        "smaller batch in the script, avoids this)"
    )


def _batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return int(v.shape[0])
    return None


def chunk_count(batch: int, k: int) -> int:
    """Micro-batches a batch of ``batch`` rows is cut into: ``k``, or ``batch`` one-row chunks when it is
    smaller (an epoch's last batch); never more rows per chunk than a full batch divisible by ``k`` has."""
    return max(1, min(k, batch))


def _split(value: Any, batch: int, k: int) -> list[Any]:
    """``value`` cut into ``k`` near-equal chunks along dim 0 when it is a batch tensor (sizes differ by at
    most one, ``torch.tensor_split``; ``chunk`` would give fewer than ``k`` for 10 rows in 4), else ``k`` copies."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch:
        return list(torch.tensor_split(value, k, dim=0))
    return [value] * k


def combine(outs: list[Any], sizes: list[int]) -> Any:
    """The chunk outputs put back together as the whole batch's output."""
    first = outs[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            if not first.is_floating_point():
                return first
            total = sum(sizes)
            return sum(o * (n / total) for o, n in zip(outs, sizes, strict=True))
        return torch.cat(outs, dim=0)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(combine([o[i] for o in outs], sizes) for i in range(len(first))))
    if isinstance(first, tuple | list):
        return type(first)(combine([o[i] for o in outs], sizes) for i in range(len(first)))
    if isinstance(first, dict):
        merged = {key: combine([o[key] for o in outs], sizes) for key in first}
        try:
            return type(first)(**merged)
        except TypeError:
            return type(first)(merged)
    if first is None or isinstance(first, int | float | str | bool):
        return first
    from torchscalpel.plan.model_io import is_kv_cache

    if is_kv_cache(first):
        # A transformers model called in training returns the key/value cache its config asks for; each chunk's
        # holds only its own rows, and a training step never reads it: no whole-batch cache, rather than a wrong one.
        return None
    raise TypeError(f"cannot combine model outputs of type {type(first).__name__}")


def install_microbatching(k: int, log: ApplyLog) -> Undo:
    """Patch ``nn.Module.__call__`` so the outermost training call of a model runs in ``k`` micro-batches."""
    from torch.utils.checkpoint import checkpoint

    original_call = nn.Module.__call__
    state = {"depth": 0}
    norms: weakref.WeakKeyDictionary[nn.Module, list[nn.Module]] = weakref.WeakKeyDictionary()

    def run_split(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        found = norms.get(module)
        if found is None:
            found = norms[module] = batch_statistics_modules(module)
        reason = batchnorm_reason(module, found) if found else None
        if reason is not None:
            log.skip("microbatch", reason)
            return original_call(module, *args, **kwargs)
        batch = _batch_size(args, kwargs)
        if batch is None or batch < 2:
            log.skip(
                "microbatch",
                f"{type(module).__name__} was called without a batch dimension to split "
                f"({'no tensor input' if batch is None else 'a batch of 1'}); ran unsplit",
            )
            return original_call(module, *args, **kwargs)
        # An indivisible batch (an epoch's last, smaller one) is split too: run unsplit it would hold the
        # whole batch's activations at once and cross the limit the micro-batches were chosen for.
        n = chunk_count(batch, k)
        split_args = [_split(a, batch, n) for a in args]
        split_kwargs = {key: _split(v, batch, n) for key, v in kwargs.items()}
        outs, sizes = [], []

        def chunk_forward(*xs: Any, kw: dict[str, Any]) -> Any:
            # Also runs again in backward (the recompute): the depth keeps submodules and the model
            # itself from being split a second time there.
            state["depth"] += 1
            try:
                return original_call(module, *xs, **kw)
            finally:
                state["depth"] -= 1

        for i in range(n):
            a = tuple(s[i] for s in split_args)
            kw = {key: s[i] for key, s in split_kwargs.items()}
            outs.append(checkpoint(chunk_forward, *a, kw=kw, use_reentrant=False))
            sizes.append(
                next(int(t.shape[0]) for t in (*a, *kw.values()) if isinstance(t, torch.Tensor) and t.dim())
            )
        shown = f"{min(sizes)}" if min(sizes) == max(sizes) else f"{max(sizes)} and {min(sizes)}"
        log.did("microbatch", f"{type(module).__name__}: batch {batch} in {n} micro-batches of {shown}")
        return combine(outs, sizes)

    def call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        # Inside backward (a graph task running) a module call is a checkpoint's recompute: a block
        # checkpointed by the checkpointing knob recomputes its forward there, outside any micro-batch
        # call, and must see the tensors it saved, not be split again.
        if (
            state["depth"]
            or not module.training
            or not torch.is_grad_enabled()
            or torch.compiler.is_compiling()
            or torch._C._current_graph_task_id() != -1
            or next(iter(module.parameters()), None) is None
        ):
            return original_call(module, *args, **kwargs)
        state["depth"] += 1
        try:
            return run_split(module, args, kwargs)
        finally:
            state["depth"] -= 1

    nn.Module.__call__ = call  # type: ignore[method-assign]

    def undo() -> None:
        nn.Module.__call__ = original_call  # type: ignore[method-assign]

    return undo

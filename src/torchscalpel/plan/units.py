"""The model's units during a simulated step: block-level activation checkpointing (as checkpoint_wrapper
applies it) and the marks of the moments FSDP2 acts on each unit (:func:`unit_marks`), which
:mod:`torchscalpel.plan.strategies` replays. Split from :mod:`torchscalpel.plan.simulate`, which enters both
around its steps."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from torchscalpel.plan.model_io import unique_params
from torchscalpel.plan.tracker import SimulationTracker


def nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements (fake tensors included: no storage is read)."""
    return t.numel() * t.element_size()


@contextlib.contextmanager
def checkpointed_blocks(blocks: list[tuple[str, nn.Module]], enabled: bool) -> Iterator[None]:
    """Block-level activation checkpointing (non-reentrant), as checkpoint_wrapper applies it."""
    if not enabled:
        yield
        return
    from torch.utils.checkpoint import checkpoint

    originals = []
    for _, block in blocks:
        original = block.forward
        originals.append((block, original))
        block.forward = functools.partial(_checkpoint_call, checkpoint, original)
    try:
        yield
    finally:
        for block, original in originals:
            block.forward = original


ROOT_UNIT = ""
"""Unit name of the parameters outside every block (FSDP's root ``fully_shard``)."""


@contextlib.contextmanager
def unit_marks(
    model: nn.Module, blocks: list[tuple[str, nn.Module]], tracker: SimulationTracker
) -> Iterator[None]:
    """Mark the moments FSDP2 acts on each unit (every block, and the root for the rest) in the timeline.

    ``pre_forward`` / ``post_forward``: the unit's forward starts / ends (forward hooks);
    ``pre_backward``: the first gradient reaches one of the unit's forward outputs (a hook on each
    output, as FSDP2's own pre-backward hook); ``grad``: one of the unit's parameters received its
    gradient (post-accumulate-grad hook; bytes = that gradient), the last of which in a backward
    is where FSDP2's post-backward reduce-scatter runs.
    """
    units = [(name, block) for name, block in blocks] + [(ROOT_UNIT, model)]
    in_block = {id(p) for _, b in blocks for p in b.parameters()}
    handles: list[Any] = []

    def outputs_hook(unit: str):
        def post(_module, _args, output):
            flat = tree_flatten(dict(output) if isinstance(output, Mapping) else output)[0]
            tensors = [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad]
            fired = [False]

            def on_grad(grad):
                if not fired[0]:
                    fired[0] = True
                    tracker.mark("pre_backward", unit)
                return grad

            for t in tensors:
                t.register_hook(on_grad)
            tracker.mark("post_forward", unit)

        return post

    for unit, module in units:
        handles.append(
            module.register_forward_pre_hook(lambda _m, _a, unit=unit: tracker.mark("pre_forward", unit))
        )
        handles.append(module.register_forward_hook(outputs_hook(unit)))
        owned = (
            p
            for p in unique_params(module)
            if p.requires_grad and (unit != ROOT_UNIT or id(p) not in in_block)
        )
        for p in owned:
            handles.append(
                p.register_post_accumulate_grad_hook(
                    lambda q, unit=unit: tracker.mark(
                        "grad", unit, nbytes(q.grad) if q.grad is not None else 0
                    )
                )
            )
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _checkpoint_call(checkpoint, original, *args, **kwargs):
    from torchscalpel.plan.model_io import without_kv_cache

    args, kwargs = without_kv_cache(args, kwargs)  # the recompute must not write a transformers cache twice
    return checkpoint(original, *args, use_reentrant=False, **kwargs)

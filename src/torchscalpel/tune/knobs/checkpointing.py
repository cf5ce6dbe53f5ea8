"""Activation checkpointing knob: recompute each repeated block's forward in backward instead of keeping its activations.

The blocks are :func:`torchscalpel.blocks.find_blocks` of the model (the one "repeated block"
definition plan, compile and dist use). The first time the model is called, each block's ``forward``
becomes an instance attribute that runs the original under ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)`` while training with grad enabled (evaluation and no-grad calls run it plainly);
undo deletes the attribute. Same arithmetic, recomputed: numerics are exact. A BatchNorm (or any norm
layer with running statistics) inside a block updates them once per step, as without the knob: the
recompute runs on copies of its running buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.tune.knobs.base import EXACT, ApplyLog, Knob, RootHooks, SetupHook, Undo
from torchscalpel.tune.settings import TuneSettings

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts

MEMORY_ONLY = (
    "a memory knob: 'scalpel tune --fit SIZE' and 'scalpel memory' recommend it; it never makes a step faster"
)


class CheckpointingKnob(Knob):
    """``checkpointing = "blocks"``."""

    name = "checkpointing"
    numerics = EXACT
    description = "activation checkpointing of the repeated blocks"

    def is_set(self, settings: TuneSettings) -> bool:
        return settings.checkpointing is not None

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        return [], MEMORY_ONLY

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        if settings.checkpointing is None:
            return None
        return lambda: install_checkpointing(log)

    def code_lines(self, settings: TuneSettings) -> list[str]:
        if settings.checkpointing is None:
            return []
        return [
            "from torch.utils.checkpoint import checkpoint",
            "# in the model's forward, for each repeated block:",
            "x = checkpoint(block, x, use_reentrant=False)",
        ]


_RUNNING = ("running_mean", "running_var", "num_batches_tracked")


def _running_stats(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The norm layers in ``module`` that update running statistics when called in training mode."""
    from torch.nn.modules.batchnorm import _NormBase

    return [m for m in module.modules() if isinstance(m, _NormBase) and m.track_running_stats]


def _recompute_keeping_running_stats(original: Any, norms: list[torch.nn.Module]) -> Any:
    """``original``, except that a call in backward (the checkpoint's recompute) leaves running stats as they were.

    The forward already updated them once; the recompute would update them again (BatchNorm's running
    mean and variance, and its batch count, twice per step). The recompute runs on copies of the buffers,
    and the module's own buffers are put back: not copied into, so nothing saved for backward changes.
    """

    def run(*args: Any, **kwargs: Any) -> Any:
        if torch._C._current_graph_task_id() == -1:
            return original(*args, **kwargs)
        kept = [(m, {n: getattr(m, n) for n in _RUNNING if getattr(m, n, None) is not None}) for m in norms]
        for m, buffers in kept:
            for n, t in buffers.items():
                setattr(m, n, t.clone())
        try:
            return original(*args, **kwargs)
        finally:
            for m, buffers in kept:
                for n, t in buffers.items():
                    setattr(m, n, t)

    return run


def checkpointed(module: torch.nn.Module) -> Any:
    """``module.forward`` run under non-reentrant checkpointing while training with grad."""
    original = type(module).forward.__get__(module)
    norms = _running_stats(module)
    inner = _recompute_keeping_running_stats(original, norms) if norms else original

    def forward(*args: Any, **kwargs: Any) -> Any:
        if module.training and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            from torch.utils.checkpoint import checkpoint

            from torchscalpel.plan.model_io import without_kv_cache

            # a transformers layer writing its key/value cache would write it again in the recompute
            args, kwargs = without_kv_cache(args, kwargs)
            return checkpoint(inner, *args, use_reentrant=False, **kwargs)
        return original(*args, **kwargs)

    return forward


def install_checkpointing(log: ApplyLog) -> Undo:
    """On each model's first call, checkpoint its repeated blocks; the undo restores them."""
    from torchscalpel.blocks import find_blocks

    done: set[int] = set()
    wrapped: list[torch.nn.Module] = []

    def pre(model: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if id(model) in done or torch._C._current_graph_task_id() != -1:
            return None  # seen, or a checkpointed block's recompute in backward (its parts look like roots)
        done.add(id(model))
        blocks = find_blocks(model)
        if not blocks:
            log.skip("checkpointing", f"{type(model).__name__} has no repeated block to checkpoint")
            return None
        for _, block in blocks:
            if "forward" not in block.__dict__:
                block.forward = checkpointed(block)
                wrapped.append(block)
        log.did(
            "checkpointing", f"activation checkpointing of {len(blocks)} {type(blocks[0][1]).__name__} blocks"
        )
        return None

    remove = RootHooks(on_pre=pre).install()

    def undo() -> None:
        remove()
        for block in wrapped:
            block.__dict__.pop("forward", None)

    return undo

"""The one vocabulary every stored byte is filed under, for the memory report and the plan alike: torch-free, so
that rendering a memory report (``report/memory_*``) does not import torch for one tuple.

Both users account storages through :class:`~torchscalpel.runtime.storage_ledger.StorageLedger` and file each
under one :data:`Category`. A storage an op returns starts as ``temporaries``; one autograd saves for backward
becomes ``activations``; ``parameters``, ``buffers``, ``gradients``, ``optimizer_state`` and ``inputs`` are given
by whoever knows the owner (the memory observer, the plan's simulation).

The two users differ only in which categories they keep apart, never in what a name means:

- the memory report (:data:`CATEGORIES`) files a model's buffers with its parameters (the observer adopts both as
  ``parameters``; a user reads them as "the model") and a batch as ``temporaries`` (nothing tells the runtime which
  tensors are the batch);
- the plan (:data:`ALL_CATEGORIES`) keeps ``buffers`` and ``inputs`` apart, because a strategy re-weights each
  category on its own (FSDP shards parameters, gradients and optimizer state, not buffers or the batch).

The plan's older short labels map one to one: ``param`` -> ``parameters``, ``buffer`` -> ``buffers``, ``grad`` ->
``gradients``, ``optim`` -> ``optimizer_state``, ``input`` -> ``inputs``, and ``act`` (everything else) ->
``activations`` + ``temporaries``. They were internal to the plan: no saved record carried them.
"""

from __future__ import annotations

from typing import Literal

Category = Literal[
    "parameters", "buffers", "gradients", "optimizer_state", "inputs", "activations", "temporaries"
]
"""The name of one category (what a record's ``by_category`` is keyed by)."""

ALL_CATEGORIES: tuple[Category, ...] = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "inputs",
    "activations",
    "temporaries",
)
"""Every category, the plan's set (see the module docstring)."""

CATEGORIES: tuple[Category, ...] = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
)
"""The memory report's categories, in the order its breakdown prints them (allocator cache is added on CUDA)."""

BEFORE_TRAINING = "before training"
"""The phase of everything allocated before the model's first training forward (and before any evaluation)."""

EVALUATION = "evaluation"
"""The phase from a root forward without grad (``torch.no_grad()`` evaluation) to the next training event."""

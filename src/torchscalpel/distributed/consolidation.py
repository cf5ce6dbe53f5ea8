"""``consolidate(ckpt, out.safetensors)``: one file of model weights with clean names, for export.

Reads a DCP checkpoint without a process group, keeps the ``model.`` entries, strips wrapper
prefixes (``module.``, ``_orig_mod.``, ``_checkpoint_wrapped_module.``) and writes safetensors.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from torchscalpel.distributed import manifest
from torchscalpel.distributed.manifest import CheckpointError
from torchscalpel.distributed.safedcp import SafeFileSystemReader, WeightsOnlyLoadPlanner, read_metadata

WRAPPER_PARTS = ("module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")


def clean_key(key: str) -> str:
    """``module._orig_mod.layers.0.weight`` -> ``layers.0.weight``."""
    return ".".join(part for part in key.split(".") if part not in WRAPPER_PARTS)


def consolidate(
    ckpt: str | Path, out: str | Path, *, dtype: torch.dtype | None = None, sign_key: str | Path | None = None
) -> Path:
    """Write the model weights of checkpoint ``ckpt`` (a ``step-N`` folder, or a Checkpointer folder
    whose newest checkpoint is used) into one safetensors file; return its path. With ``sign_key``
    the checkpoint's HMAC signature must match (see ``Checkpointer(sign_key=)``)."""
    verify_key = manifest.read_key(sign_key) if sign_key is not None else None
    folder = Path(ckpt)
    if not (folder / manifest.COMMIT).exists():
        newest = manifest.latest(folder)
        if newest is None:
            raise CheckpointError(
                f"{folder} holds no committed checkpoint; pass a step-N folder or a Checkpointer folder."
            )
        folder = newest
    problem = manifest.check(folder, full=True, key=verify_key)
    if problem is not None:
        raise CheckpointError(f"Refusing to consolidate: {problem.message}.")
    metadata = read_metadata(folder / ".metadata")
    state: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata):
            state[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not state:
        raise CheckpointError(f"{folder} holds no model tensors.")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process": it is
        dcp.load(
            state,
            storage_reader=SafeFileSystemReader(str(folder)),
            planner=WeightsOnlyLoadPlanner(),
            no_dist=True,
        )
    clean: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        name = clean_key(key[len("model.") :])
        if name in clean:
            raise CheckpointError(f"Two entries map to {name!r} after removing wrapper prefixes.")
        clean[name] = (
            tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
        ).contiguous()
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file(clean, str(target), metadata={"source": str(folder), "format": "pt"})
    return target

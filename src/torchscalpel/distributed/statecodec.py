"""Small state (RNG, scheduler, scaler, loader position, counters) as JSON plus safetensors.

Nothing is pickled: plain values go to JSON, tensors and NumPy arrays to a safetensors file, so
loading cannot run code. Also the per-rank random-generator snapshot and restore.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from torchscalpel.distributed.manifest import CheckpointError, write_durable


def encode(obj: Any, tensors: dict[str, torch.Tensor], path: str = "") -> Any:
    """JSON-ready form of ``obj``; tensors are moved into ``tensors`` under a generated key."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(
            np.ascontiguousarray(obj).astype(np.int64 if obj.dtype.kind in "iu" else obj.dtype)
        )
        return {"__ndarray__": key, "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode(v, tensors, f"{path}.{k}") for k, v in obj.items()}
        return {
            "__items__": [[encode(k, tensors), encode(v, tensors, f"{path}[{k!r}]")] for k, v in obj.items()]
        }
    raise CheckpointError(
        f"Cannot store {type(obj).__name__} at {path or 'top level'} without pickle; keep checkpoint state to "
        "tensors, numbers, strings, lists and dicts (e.g. a LambdaLR lambda is code: rebuild it, do not save it)."
    )


def decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(obj, list):
        return [decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return tensors[obj["__ndarray__"]].numpy().astype(obj["dtype"])
        if "__tuple__" in obj:
            return tuple(decode(v, tensors) for v in obj["__tuple__"])
        if "__items__" in obj:
            return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in obj["__items__"]}
        return {k: decode(v, tensors) for k, v in obj.items()}
    return obj


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def save_state(state: dict[str, Any], stem: Path) -> None:
    """Write ``stem.json`` and ``stem.safetensors`` durably."""
    tensors: dict[str, torch.Tensor] = {}
    doc = encode(state, tensors)
    save_file(tensors, str(stem.with_suffix(".safetensors")))
    with open(stem.with_suffix(".safetensors"), "rb+") as fh:
        os.fsync(fh.fileno())
    write_durable(stem.with_suffix(".json"), json.dumps(doc, allow_nan=True).encode())


def load_state(stem: Path) -> dict[str, Any]:
    """Read what :func:`save_state` wrote."""
    tensors = load_file(str(stem.with_suffix(".safetensors")))
    return decode(json.loads(stem.with_suffix(".json").read_bytes()), tensors)


def rng_snapshot() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU and CUDA generator states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def rng_restore(state: dict[str, Any]) -> None:
    """Put back what :func:`rng_snapshot` took."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""The transform a DataLoader's dataset applies, written down as plain data for the Run record.

``scalpel export --transform-from RUN`` reads it back (``ship.transforms.from_record``) and recognises the
known steps there; here nothing is judged, only copied: each object in the chain becomes
``{"class": NAME, "attrs": {...}}`` holding the attributes torchvision-style transforms keep (numbers,
strings, lists of them; a small tensor as a list; an enum as its value; a dtype as its name), and a
chain (``Compose.transforms``, ``nn.Sequential``, a list) becomes ``{"class": "Compose", "items": [...]}``.
A function or lambda is recorded by its name only, so export can refuse it by name. Never the object
itself: a record is data and is never unpickled.
"""

from __future__ import annotations

import enum
import inspect
from typing import Any

ATTRS = ("mean", "std", "size", "interpolation", "max_size", "antialias", "dtype", "scale", "inplace")
"""Attributes copied from a transform object (what ``ship.transforms`` reads)."""
MAX_ITEMS = 32
MAX_NUMBERS = 64


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-plain copy of ``value``, or None when it is not small plain data."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value[:200] if isinstance(value, str) else value
    if isinstance(value, enum.Enum):
        return _plain(value.value, depth + 1)
    if type(value).__name__ == "dtype":  # torch.dtype, without importing torch here
        return str(value)
    if hasattr(value, "tolist") and hasattr(value, "numel"):
        try:
            return value.tolist() if int(value.numel()) <= MAX_NUMBERS else None
        except Exception:
            return None
    if isinstance(value, (list, tuple)) and depth < 2 and len(value) <= MAX_NUMBERS:
        items = [_plain(v, depth + 1) for v in value]
        return items if all(v is not None for v in items) else None
    if isinstance(value, dict) and depth < 2 and len(value) <= 8:  # v2.ToDtype({Image: float32, ...})
        return {getattr(k, "__name__", str(k))[:60]: _plain(v, depth + 1) for k, v in value.items()}
    return None


def snapshot(obj: Any, depth: int = 0) -> dict[str, Any]:
    """One transform (or chain) as plain data."""
    name = type(obj).__name__
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isbuiltin(obj):
        return {"class": "function", "name": str(getattr(obj, "__qualname__", name))[:120]}
    items: list[Any] | None = None
    if isinstance(obj, (list, tuple)):
        items = list(obj)
    elif isinstance(getattr(obj, "transforms", None), (list, tuple)):
        items = list(obj.transforms)
    elif name == "Sequential" and callable(getattr(obj, "children", None)):
        items = list(obj.children())
    if items is not None and depth < 4:
        return {"class": "Compose", "items": [snapshot(i, depth + 1) for i in items[:MAX_ITEMS]]}
    attrs = {a: _plain(getattr(obj, a)) for a in ATTRS if hasattr(obj, a)}
    out: dict[str, Any] = {"class": name[:80], "attrs": attrs}
    if name == "Lambda":
        out["name"] = str(getattr(getattr(obj, "lambd", None), "__qualname__", "lambda"))[:120]
    return out


def dataset_transform(dataset: Any) -> dict[str, Any] | None:
    """The snapshot of ``dataset.transform`` (through one ``Subset``-style ``.dataset``), None when it has none.
    Best effort: an attribute that raises leaves the transform out, never the run."""
    try:
        for holder in (dataset, getattr(dataset, "dataset", None)):
            transform = getattr(holder, "transform", None) if holder is not None else None
            if transform is not None:
                return {"dataset": type(holder).__name__[:80], "transform": snapshot(transform)}
    except Exception:
        return None
    return None

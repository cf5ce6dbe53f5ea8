"""Parsing what the user types for ``scalpel plan``: batch specs and factory arguments.

Sizes are :mod:`torchscalpel.units`, ``MODULE:NAME`` references :mod:`torchscalpel.loading`.

Batch SPEC grammar (one entry per tensor, comma-separated)::

    NAME=DTYPE[D0,D1,...][:HIGH]

``x=float32[8,3,32,32],y=int64[8]:10`` is a float image batch ``x`` and integer labels ``y`` drawn
from ``[0, 10)``. Dimension 0 of every entry is the batch dimension (the one the max-batch search
scales). ``:HIGH`` is the exclusive upper bound of integer values (class count, vocabulary size);
integer entries without it use 2. Every parse error is a :class:`UsageError` naming the entry.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import torch

from torchscalpel.errors import UsageError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "double": torch.float64,
    "int64": torch.int64,
    "long": torch.int64,
    "int32": torch.int32,
    "int": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}

_ENTRY = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([A-Za-z0-9_]+)\s*\[([^\]]*)\]\s*(?::\s*(\d+))?\s*$")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One named tensor of the batch: dtype, shape, integer value bound, and which dimension is the
    batch (0 for every ``--batch`` entry; script mode finds it, None for a tensor without one)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    high: int | None = None
    batch_dim: int | None = 0

    def with_batch(self, batch: int) -> TensorSpec:
        """The same tensor with its batch dimension set to ``batch`` (scalars stay scalars)."""
        d = self.batch_dim
        if d is None or d >= len(self.shape):
            return self
        shape = (*self.shape[:d], batch, *self.shape[d + 1 :])
        return TensorSpec(self.name, self.dtype, shape, self.high, d)

    def text(self) -> str:
        """Back to the SPEC form, e.g. ``y=int64[8]:10``."""
        dtype = str(self.dtype).removeprefix("torch.")
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.name}={dtype}[{dims}]" + (f":{self.high}" if self.high is not None else "")

    def make(self, device: str | torch.device) -> torch.Tensor:
        """A tensor of this spec (random values; under fake mode no memory is allocated)."""
        if self.dtype.is_floating_point:
            return torch.randn(self.shape, dtype=self.dtype, device=device)
        if self.dtype == torch.bool:
            return torch.zeros(self.shape, dtype=torch.bool, device=device)
        return torch.randint(0, self.high or 2, self.shape, dtype=self.dtype, device=device)


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """The batch one training step sees, entry by entry, in the order the user wrote them."""

    entries: tuple[TensorSpec, ...]

    @property
    def batch_size(self) -> int:
        """The batch dimension of the first entry that has one."""
        for entry in self.entries:
            if entry.batch_dim is not None and entry.batch_dim < len(entry.shape):
                return entry.shape[entry.batch_dim]
        return 1

    def with_batch(self, batch: int) -> BatchSpec:
        """Every entry's batch dimension set to ``batch``."""
        return BatchSpec(tuple(e.with_batch(batch) for e in self.entries))

    def batch_dims(self) -> str:
        """Which dimension of each entry is the batch, e.g. ``dim 1 of arg0, arg1_0; not scaled: arg2``."""
        by_dim: dict[int | None, list[str]] = {}
        for e in self.entries:
            if e.shape:
                by_dim.setdefault(
                    e.batch_dim if e.batch_dim is not None and e.batch_dim < len(e.shape) else None, []
                ).append(e.name)
        parts = [
            f"dim {d} of {', '.join(names)}"
            for d, names in sorted((k, v) for k, v in by_dim.items() if k is not None)
        ]
        if None in by_dim:
            parts.append(f"not scaled: {', '.join(by_dim[None])}")
        return "; ".join(parts)

    def text(self) -> str:
        """Back to the SPEC form."""
        return ",".join(e.text() for e in self.entries)

    def make(self, device: str | torch.device) -> dict[str, torch.Tensor]:
        """One tensor per entry, keyed by name."""
        return {e.name: e.make(device) for e in self.entries}


def parse_batch_spec(text: str) -> BatchSpec:
    """Parse ``NAME=DTYPE[D0,...][:HIGH],...``; raise :class:`UsageError` on the first bad entry."""
    if not text or not text.strip():
        raise UsageError("--batch is empty; write it like 'x=float32[8,3,32,32],y=int64[8]:10'.")
    entries: list[TensorSpec] = []
    for raw in _split_entries(text):
        match = _ENTRY.match(raw)
        if not match:
            raise UsageError(
                f"Cannot read batch entry {raw.strip()!r}; write NAME=DTYPE[D0,D1,...] with an optional :HIGH "
                "for integer values, e.g. 'y=int64[8]:10'."
            )
        name, dtype_name, dims, high = match.groups()
        dtype = DTYPES.get(dtype_name.lower())
        if dtype is None:
            raise UsageError(
                f"Unknown dtype {dtype_name!r} in batch entry {name!r}; use one of {', '.join(sorted(DTYPES))}."
            )
        try:
            shape = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            raise UsageError(
                f"Batch entry {name!r} has a non-integer dimension in [{dims}]; dimensions are whole numbers."
            ) from None
        if any(d <= 0 for d in shape):
            raise UsageError(
                f"Batch entry {name!r} has a dimension <= 0 in [{dims}]; every dimension must be positive."
            )
        if high is not None and (dtype.is_floating_point or dtype == torch.bool):
            raise UsageError(
                f"Batch entry {name!r} is {dtype_name}; ':{high}' only applies to integer entries."
            )
        if high is not None and int(high) <= 0:
            raise UsageError(f"Batch entry {name!r} has ':{high}'; the integer upper bound must be positive.")
        if any(e.name == name for e in entries):
            raise UsageError(f"Batch entry {name!r} appears twice; give each tensor its own name.")
        entries.append(TensorSpec(name, dtype, shape, int(high) if high is not None else None))
    batch_dims = {e.shape[0] for e in entries if e.shape}
    if len(batch_dims) > 1:
        raise UsageError(
            f"Batch entries disagree on dimension 0 ({sorted(batch_dims)}); dimension 0 is the batch size in every entry."
        )
    return BatchSpec(tuple(entries))


def _split_entries(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def parse_factory_args(text: str | None) -> dict[str, Any]:
    """``--factory-args`` JSON object -> keyword arguments for the factory."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--factory-args is not valid JSON ({exc.msg}); write an object like '{{\"depth\": 4}}'."
        ) from None
    if not isinstance(value, dict):
        raise UsageError("--factory-args must be a JSON object of keyword arguments, e.g. '{\"depth\": 4}'.")
    return value

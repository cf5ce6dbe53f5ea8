"""Example inputs for export and parity: parsing ``--example SPEC`` and making batches of any size.

A spec is one of:

- ``float32[1,1,8,8]`` or ``x=float32[1,1,8,8]``: random normal values of that dtype and shape;
- ``int64[1,16]:0..1000``: random integers in ``[0, 1000)`` (token ids, class indices);
- ``PATH.npy`` or ``x=PATH.npy``: real inputs from a NumPy file (never pickled: ``allow_pickle=False``);
- ``PATH.safetensors``: every tensor in the file, one input each, keyed by name.

The first dimension of every input is the batch dimension: parity and latency re-make the inputs
at batch sizes 1, 7 and the maximum (random specs draw fresh values; file inputs repeat their rows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from torchscalpel.errors import UsageError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
"""Input dtypes a spec may name (the names are also the manifest's dtype strings)."""

_SPEC = re.compile(r"^(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)=)?(?P<body>.+)$")
_RANDOM = re.compile(r"^(?P<dtype>[a-z0-9]+)\[(?P<shape>[0-9, ]+)\](?::(?P<lo>-?\d+)\.\.(?P<hi>-?\d+))?$")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the manifest's spelling)."""
    return str(dtype).removeprefix("torch.")


@dataclass(kw_only=True, slots=True)
class ExampleInput:
    """One model input: its name, and either a random recipe or the rows read from a file."""

    name: str | None
    dtype: torch.dtype
    shape: tuple[int, ...]
    """Shape of the example as given (first dimension is the batch)."""
    low: int = 0
    high: int = 2
    """Integer range for random integer inputs (``high`` exclusive)."""
    data: torch.Tensor | None = None
    """Real values from a file; ``None`` for random inputs."""

    def batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """This input at batch ``size``: fresh random values, or the file's rows repeated/cut."""
        if self.data is not None:
            reps = -(-size // self.data.shape[0])
            return self.data.repeat(reps, *([1] * (self.data.dim() - 1)))[:size].contiguous()
        shape = (size, *self.shape[1:])
        if self.dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=generator).bool()
        if self.dtype.is_floating_point:
            return torch.randn(shape, generator=generator).to(self.dtype)
        return torch.randint(self.low, self.high, shape, generator=generator).to(self.dtype)


def with_sizes(inp: ExampleInput, sizes: dict[int, int]) -> ExampleInput:
    """``inp`` with other sizes in some non-batch dimensions (a file's rows are cut or tiled along them)."""
    sizes = {d: n for d, n in sizes.items() if 0 < d < len(inp.shape)}
    if not sizes:
        return inp
    shape = tuple(sizes.get(d, n) for d, n in enumerate(inp.shape))
    data = inp.data
    if data is not None:
        for d, n in sizes.items():
            reps = -(-n // data.shape[d])
            data = data.repeat(*[reps if i == d else 1 for i in range(data.dim())]).narrow(d, 0, n)
        data = data.contiguous()
    return ExampleInput(name=inp.name, dtype=inp.dtype, shape=shape, low=inp.low, high=inp.high, data=data)


def parse_example(spec: str) -> list[ExampleInput]:
    """Parse one ``--example`` value into one input (or several, for a safetensors file)."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise UsageError(
            f"Cannot read --example {spec!r}; write e.g. 'float32[1,3,224,224]' or 'x=inputs.npy'."
        )
    name, body = match.group("name"), match.group("body")
    rand = _RANDOM.match(body.replace(" ", ""))
    if rand:
        dtype = DTYPES.get(rand.group("dtype"))
        if dtype is None:
            raise UsageError(
                f"Unknown dtype {rand.group('dtype')!r} in --example; use one of {', '.join(DTYPES)}."
            )
        shape = tuple(int(s) for s in rand.group("shape").split(",") if s)
        if not shape or min(shape) < 1:
            raise UsageError(f"--example {spec!r} needs a shape with a batch dimension and no zero sizes.")
        low, high = (0, 2)
        if rand.group("lo") is not None:
            low, high = int(rand.group("lo")), int(rand.group("hi"))
            if high <= low:
                raise UsageError(f"--example {spec!r}: the integer range LOW..HIGH needs HIGH > LOW.")
        return [ExampleInput(name=name, dtype=dtype, shape=shape, low=low, high=high)]
    path = Path(body)
    if not path.exists():
        raise UsageError(
            f"--example {spec!r} is neither a spec like 'float32[1,3,224,224]' nor an existing .npy/.safetensors file."
        )
    if path.suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise UsageError(
                f"Cannot read {path} as a plain .npy array ({exc}); save it with np.save."
            ) from None
        return [_from_tensor(name, torch.from_numpy(np.ascontiguousarray(arr)), path)]
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        if name is not None:
            raise UsageError(
                f"--example {spec!r}: a safetensors file names its inputs itself; drop '{name}='."
            )
        return [_from_tensor(k, v, path) for k, v in tensors.items()]
    raise UsageError(f"--example file {path} must be .npy or .safetensors.")


def _from_tensor(name: str | None, tensor: torch.Tensor, path: Path) -> ExampleInput:
    if tensor.dim() == 0 or tensor.shape[0] == 0:
        raise UsageError(f"The example in {path} needs a batch dimension with at least one row.")
    return ExampleInput(name=name, dtype=tensor.dtype, shape=tuple(tensor.shape), data=tensor)


def parse_examples(specs: list[str]) -> list[ExampleInput]:
    """Parse every ``--example`` in order (the order of the model's forward arguments)."""
    if not specs:
        raise UsageError("Give at least one --example, e.g. --example 'float32[1,1,8,8]'.")
    inputs = [inp for spec in specs for inp in parse_example(spec)]
    return inputs


def make_batch(inputs: list[ExampleInput], size: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Every input at batch ``size``, reproducibly (same seed, same values)."""
    gen = torch.Generator().manual_seed(seed * 1009 + size)
    return tuple(inp.batch(size, gen) for inp in inputs)

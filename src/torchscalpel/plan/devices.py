"""Target devices: the table in ``torchscalpel/data/devices.json``, ``--device-memory``, or this machine.

A device has a memory capacity and a kind. The kind decides the overheads the plan adds on top of
allocated bytes: on CUDA/ROCm a context that the caching allocator never sees and a fragmentation
margin; on CPU neither (malloc returns memory to the allocator's pool the moment a tensor dies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from torchscalpel.envcheck.tables import load_table
from torchscalpel.errors import UsageError
from torchscalpel.units import parse_size

GIB = 1024**3
CONTEXT_BYTES = {"cuda": GIB // 2, "rocm": GIB // 2, "cpu": 0}
"""Device memory the CUDA context and kernels images take, outside torch's allocator (typ. 0.3-0.6 GiB)."""
MARGIN = {"cuda": 0.08, "rocm": 0.08, "cpu": 0.0}
"""Caching-allocator fragmentation, as a share of the allocated peak (reserved - allocated, typical)."""


@dataclass(frozen=True, slots=True)
class Device:
    """A planning target: name, capacity in bytes, kind (``cuda``, ``rocm`` or ``cpu``)."""

    name: str
    memory: int
    kind: str

    @property
    def context_bytes(self) -> int:
        """Fixed memory outside the allocator."""
        return CONTEXT_BYTES.get(self.kind, 0)

    @property
    def margin(self) -> float:
        """Fragmentation margin as a share of the allocated peak."""
        return MARGIN.get(self.kind, 0.0)

    def needed(self, allocated_peak: int) -> int:
        """Bytes of device memory a run whose allocator peak is ``allocated_peak`` needs."""
        return int(allocated_peak * (1 + self.margin)) + self.context_bytes

    def usable_for_allocations(self) -> int:
        """The largest allocator peak that still fits."""
        return max(0, int((self.memory - self.context_bytes) / (1 + self.margin)))

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return {
            "name": self.name,
            "memory": self.memory,
            "kind": self.kind,
            "context_bytes": self.context_bytes,
            "margin": self.margin,
        }


class DeviceEntry(TypedDict):
    """One row of data/devices.json."""

    memory_mib: int
    kind: str


def device_table() -> dict[str, DeviceEntry]:
    """The bundled device table, keyed by name."""
    return {k: v for k, v in load_table("devices.json").items() if not k.startswith("_")}


def resolve_device(name: str | None, memory: str | None, *, kind: str | None = None) -> Device:
    """The target from ``--device NAME`` or ``--device-memory SIZE`` (or this machine when neither)."""
    if name and memory:
        raise UsageError("Give either --device or --device-memory, not both.")
    if memory:
        return Device(
            name=f"{memory} device", memory=parse_size(memory, flag="--device-memory"), kind=kind or "cuda"
        )
    if name:
        table = device_table()
        lookup = {k.lower().replace("_", "-"): k for k in table}
        key = lookup.get(name.lower().replace("_", "-"))
        if key is None and name.lower() == "cpu":
            return _this_cpu()
        if key is None:
            raise UsageError(
                f"Unknown device {name!r}; use one of {', '.join(table)}, cpu, or --device-memory SIZE."
            )
        entry = table[key]
        return Device(name=key, memory=int(entry["memory_mib"]) * 1024**2, kind=str(entry["kind"]))
    return local_device()


def local_device() -> Device:
    """This machine's first GPU if there is one, else its RAM."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        return Device(name=props.name, memory=int(props.total_memory), kind=kind)
    return _this_cpu()


def _this_cpu() -> Device:
    import psutil

    return Device(name="cpu (this machine's RAM)", memory=int(psutil.virtual_memory().total), kind="cpu")

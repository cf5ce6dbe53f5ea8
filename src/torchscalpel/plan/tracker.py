"""Allocation tracking on fake tensors: every storage an op creates, when it is freed, what it was.

:class:`SimulationTracker` is a ``TorchDispatchMode`` that sits above ``FakeTensorMode``: each op's
output storages that it has not seen before count as allocations in the project's one storage ledger
(:class:`~torchscalpel.runtime.storage_ledger.StorageLedger`, which ``scalpel memory``'s tracker of real
tensors shares), whose weak reference on the storage counts the free. Storages, not tensors, are the unit,
so views and in-place ops never count twice, and a parameter saved for backward is still just the
parameter. Categories (the one vocabulary of :mod:`~torchscalpel.runtime.memory_categories`: parameters,
gradients, optimizer state, ...) can be given after the fact, because the allocation log keeps one record
per storage lifetime; :meth:`SimulationTracker.timeline` then gives the live bytes of each category at
every event (as the storages are filed at the end), which the strategy model re-weights (sharding,
buckets) to get per-rank peaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from torchscalpel.runtime.memory_categories import ALL_CATEGORIES, Category
from torchscalpel.runtime.storage_ledger import StorageLedger

CATEGORIES = ALL_CATEGORIES
"""The categories a plan keeps apart: all of them (buffers and inputs too, which no strategy shards)."""


PROBED_OPS = frozenset({"aten.mkldnn_rnn_layer.default"})
"""Ops whose fake implementation under-reports an output's size: oneDNN's LSTM/GRU training workspace
is a 0-byte tensor on fake tensors but ~16x the layer output for real. These run once for real, on
zeros of the same shapes (cached by shape), to read the true output sizes."""
_PROBE_CACHE: dict[tuple, list[int]] = {}
_PROBE_RATIOS: dict[str, list[float]] = {}
PROBE_LIMIT = 64 * 1024**2
"""Largest input (bytes) a probe runs for real; beyond it the last probe's output/input ratio is used."""


def _probed_sizes(func, args, kwargs, outputs) -> list[int] | None:
    """Real output storage sizes of ``func`` for these argument shapes (None if the probe fails)."""
    from torch.utils._python_dispatch import _disable_current_modes

    flat, spec = tree_flatten((args, kwargs))
    key = (
        str(func),
        tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else repr(a) for a in flat),
    )
    in_bytes = sum(a.numel() * a.element_size() for a in flat if isinstance(a, torch.Tensor))
    if key not in _PROBE_CACHE and in_bytes > PROBE_LIMIT:
        # Too big to run for real (the max-batch search goes far): scale the last probe of this op,
        # whose outputs grow linearly with its inputs (batch x sequence).
        ratios = _PROBE_RATIOS.get(str(func))
        return [int(r * in_bytes) for r in ratios] if ratios and len(ratios) == len(outputs) else None
    if key not in _PROBE_CACHE:
        try:
            with _disable_current_modes():
                real = [
                    torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in flat
                ]
                from torch.utils._pytree import tree_unflatten

                r_args, r_kwargs = tree_unflatten(real, spec)
                result = func(*r_args, **r_kwargs)
                _PROBE_CACHE[key] = [
                    int(t.untyped_storage().nbytes())
                    for t in tree_flatten(result)[0]
                    if isinstance(t, torch.Tensor)
                ]
                _PROBE_RATIOS[str(func)] = [n / max(1, in_bytes) for n in _PROBE_CACHE[key]]
        except Exception:  # a probe is a refinement; without it the fake size stands
            _PROBE_CACHE[key] = []
    sizes = _PROBE_CACHE[key]
    return sizes if len(sizes) == len(outputs) else None


@dataclass(slots=True)
class StorageRecord:
    """One storage's lifetime, in event numbers (``end`` is None while it is alive), and its category now."""

    nbytes: int
    start: int
    index: int
    """Its place in :attr:`SimulationTracker.records`."""
    end: int | None = None
    category: Category = "temporaries"


@dataclass(slots=True)
class Timeline:
    """Live bytes per category after each event, and the phase each event happened in."""

    bytes: dict[str, np.ndarray]
    phase: np.ndarray
    phase_names: list[str] = field(default_factory=list)
    marks: list[tuple[int, int, str, str, int]] = field(default_factory=list)
    """(event number, phase, kind, unit, bytes): module-level moments (FSDP units' forward/backward hooks)
    placed between allocation events; a mark at event number ``i`` happened after events ``< i``."""

    def total(self) -> np.ndarray:
        """Live bytes of all categories after each event."""
        return sum((self.bytes[c] for c in CATEGORIES), start=np.zeros_like(self.phase, dtype=np.int64))

    def in_phases(self, names: tuple[str, ...]) -> np.ndarray:
        """Boolean mask of events that happened in any of the phases ``names``."""
        ids = [i for i, n in enumerate(self.phase_names) if n in names]
        return np.isin(self.phase, ids)


class SimulationTracker(StorageLedger[StorageRecord], TorchDispatchMode):
    """Counts storage allocations and frees of every op run under it (use inside ``FakeTensorMode``)."""

    def __init__(self) -> None:
        super().__init__(CATEGORIES)
        self.records: list[StorageRecord] = []
        """Every storage lifetime so far, in the order they began."""
        self._events: list[tuple[int, int]] = []  # (record index, +1 alloc / -1 free)
        self._phase_of_event: list[int] = []
        self.phase_names: list[str] = ["setup"]
        self._phase = 0
        self.marks: list[tuple[int, int, str, str, int]] = []
        self.failed_op: str | None = None
        """The op whose dispatch raised, for the error message when a model cannot run on fake tensors."""

    # -- events ---------------------------------------------------------------------------------
    def set_phase(self, name: str) -> None:
        """Tag later events with ``name`` (``forward``, ``backward``, ``optimizer``, ...)."""
        if name not in self.phase_names:
            self.phase_names.append(name)
        self._phase = self.phase_names.index(name)

    def mark(self, kind: str, unit: str, nbytes: int = 0) -> None:
        """Note a module-level moment (``kind`` of ``unit``) at the current position of the event log."""
        self.marks.append((len(self._events), self._phase, kind, unit, nbytes))

    def track(
        self, tensor: torch.Tensor, category: Category | None = None, *, only_from: Category | None = None
    ) -> int | None:
        """Count ``tensor``'s storage if it is new; file it under ``category`` if given (when ``only_from`` is
        given, only a storage filed under that one). Returns the record index."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse / nested / subclass without storage
            return None
        key = storage._cdata
        record = self.live.get(key)
        if record is None:
            record = StorageRecord(
                nbytes=int(storage.nbytes()), start=len(self._events), index=len(self.records)
            )
            if category is not None and only_from in (None, record.category):
                record.category = category
            self.records.append(record)
            self._add(key, storage, record)
        elif category is not None and only_from in (None, record.category):
            self.move(record, category)
        return record.index

    def label(self, tensor: torch.Tensor, category: Category) -> None:
        """File ``tensor``'s storage under ``category`` (counting it if it is new)."""
        self.track(tensor, category)

    def _added(self, record: StorageRecord) -> None:
        self._log(record.index, +1)

    def _release(self, record: StorageRecord) -> None:
        super()._release(record)
        record.end = len(self._events)
        self._log(record.index, -1)

    def _log(self, index: int, sign: int) -> None:
        self._events.append((index, sign))
        self._phase_of_event.append(self._phase)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            out = func(*args, **(kwargs or {}))
        except Exception:
            if self.failed_op is None:
                self.failed_op = str(func)
            raise
        outputs = [item for item in tree_flatten(out)[0] if isinstance(item, torch.Tensor)]
        sizes = _probed_sizes(func, args, kwargs or {}, outputs) if str(func) in PROBED_OPS else None
        first_new = len(self.records)
        for k, item in enumerate(outputs):
            index = self.track(item)
            # only storages this op created: raise them to what the real kernel allocates
            if (
                sizes is not None
                and index is not None
                and index >= first_new
                and sizes[k] > self.records[index].nbytes
            ):
                self.resize(self.records[index], sizes[k])
        return out

    # -- results --------------------------------------------------------------------------------
    def timeline(self) -> Timeline:
        """Live bytes per category after each event so far (each storage filed as it stands now)."""
        n = len(self._events)
        deltas = {c: np.zeros(n, dtype=np.int64) for c in CATEGORIES}
        for i, (index, sign) in enumerate(self._events):
            record = self.records[index]
            deltas[record.category][i] = sign * record.nbytes
        return Timeline(
            bytes={c: np.cumsum(d) for c, d in deltas.items()},
            phase=np.asarray(self._phase_of_event, dtype=np.int64),
            phase_names=list(self.phase_names),
            marks=list(self.marks),
        )

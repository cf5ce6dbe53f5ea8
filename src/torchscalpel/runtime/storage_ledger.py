"""One ledger of live storages, counted by identity, for real tensors (memory, doctor) and fake ones (plan).

A storage is the unit, not a tensor: views, in-place ops and a parameter saved for backward never count
twice. Each storage is keyed by its C pointer (``untyped_storage()._cdata``) while it lives; a weak reference
with a callback on its Python storage object (which torch keeps alive exactly as long as the storage) takes it
out when it dies. Every live storage is filed under one
:data:`~torchscalpel.runtime.memory_categories.Category`, and the live total per category is kept as entries
come, move and go, so a reading costs nothing.

Two users build on it, each a ``TorchDispatchMode`` that decides which op outputs are new storages:

- :class:`torchscalpel.runtime.alloc_tracker.AllocationTracker` (``scalpel memory``, the doctor's memory
  rules, ``--memory-limit``): real tensors, with call sites, modules, the peak breakdown and a limit;
- :class:`torchscalpel.plan.tracker.SimulationTracker` (``scalpel plan``): fake tensors, with one record per
  storage lifetime and an event log the strategies re-weight.

They extend what happens at an entry's arrival and release (:meth:`StorageLedger._added`,
:meth:`StorageLedger._release`), never the bookkeeping itself.
"""

from __future__ import annotations

import weakref
from typing import Any, Generic, Protocol, TypeVar

from torchscalpel.runtime.memory_categories import Category


class LedgerEntry(Protocol):
    """What the ledger reads of an entry: its bytes and its category (both may change while it lives)."""

    nbytes: int
    category: Category


E = TypeVar("E", bound=LedgerEntry)


class StorageRef(weakref.ref):
    """A weak reference to a storage that carries its key (the callback needs no closure)."""

    __slots__ = ("key",)
    key: int


class StorageLedger(Generic[E]):
    """Live storages by key, their entries, and the live bytes per category.

    ``categories`` are the categories this ledger keeps (the keys of :attr:`by_category`, in that order);
    an entry's category must be one of them.
    """

    def __init__(self, categories: tuple[Category, ...]) -> None:
        super().__init__()  # the dispatch mode a user also derives from
        self.live: dict[int, E] = {}
        """Every live storage's entry, by storage key."""
        self._refs: dict[int, StorageRef] = {}
        self.total = 0
        """Live bytes of every category."""
        self.by_category: dict[Category, int] = dict.fromkeys(categories, 0)
        """Live bytes per category."""
        self._dead = self._storage_died
        """One bound method for every storage's weak-reference callback (not a closure per storage)."""

    def _add(self, key: int, storage: Any, entry: E) -> None:
        """Count ``entry`` for the storage ``storage`` (key ``key``) until the storage dies."""
        self.live[key] = entry
        ref = StorageRef(storage, self._dead)
        ref.key = key
        self._refs[key] = ref
        n = entry.nbytes
        self.total += n
        self.by_category[entry.category] += n
        self._added(entry)

    def _added(self, entry: E) -> None:
        """Called after ``entry`` was counted (the user's totals: sites, peaks, the event log)."""

    def _storage_died(self, ref: StorageRef) -> None:
        if self._refs.get(ref.key) is ref:  # never a newer storage that took the same key
            self._free(ref.key)

    def _free(self, key: int) -> None:
        """Stop counting the storage ``key`` (nothing when it is not live)."""
        entry = self.live.pop(key, None)
        self._refs.pop(key, None)
        if entry is not None:
            self._release(entry)

    def _release(self, entry: E) -> None:
        """Subtract ``entry``'s bytes; a user that extends it calls this at the moment its totals should drop."""
        n = entry.nbytes
        self.total -= n
        self.by_category[entry.category] -= n

    def move(self, entry: E, category: Category) -> None:
        """File the live ``entry`` under ``category`` from now on."""
        n = entry.nbytes
        self.by_category[entry.category] -= n
        self.by_category[category] += n
        entry.category = category

    def resize(self, entry: E, nbytes: int) -> None:
        """Count ``nbytes`` for the live ``entry`` from now on (a size learnt after the storage was counted)."""
        delta = nbytes - entry.nbytes
        self.total += delta
        self.by_category[entry.category] += delta
        entry.nbytes = nbytes

    def live_bytes(self, category: Category | None = None) -> int:
        """Bytes alive now (of one category, or all)."""
        return self.total if category is None else self.by_category.get(category, 0)

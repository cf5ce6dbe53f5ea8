"""``scalpel run --memory-limit``: a block of code run with the live-tensor accounting and its limit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torchscalpel.runtime.alloc_tracker import AllocationTracker


@contextmanager
def enforced(limit: int | None) -> Iterator[Any]:
    """Track live tensors for the block and raise :class:`MemoryLimitExceeded` past ``limit`` bytes (None: no-op)."""
    if limit is None:
        yield None
        return
    tracker = AllocationTracker(limit=limit)
    tracker.phase = None  # no step timeline here: the limit sentence names no step or phase it cannot know
    tracker.start()
    try:
        yield tracker
    finally:
        tracker.stop()

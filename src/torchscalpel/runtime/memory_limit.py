"""``--memory-limit SIZE``: the exception that ends a run whose live tensors go over the limit.

A ``BaseException`` (as the runtime's own stop is), so a script's ``except Exception`` / ``except
RuntimeError`` retry blocks cannot swallow it and keep running past the limit: the run stops at the
allocation that crossed it, and the record says what was live.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class MemoryLimitExceeded(BaseException):
    """Live tensor memory went over ``--memory-limit``; the message is one sentence."""


@contextmanager
def enforced(limit: int | None) -> Iterator[Any]:
    """Track live tensors for the block and raise :class:`MemoryLimitExceeded` past ``limit`` bytes (None: no-op)."""
    if limit is None:
        yield None
        return
    from torchscalpel.runtime.alloc_tracker import AllocationTracker

    tracker = AllocationTracker(limit=limit)
    tracker.phase = None  # no step timeline here: the limit sentence names no step or phase it cannot know
    tracker.start()
    try:
        yield tracker
    finally:
        tracker.stop()

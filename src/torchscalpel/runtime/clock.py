"""Clocks for step timing: wall time on CPU, CUDA events on GPU.

A clock hands out opaque *marks*; differences between marks are resolved later, in one place
(:meth:`Clock.resolve`), so a CUDA run synchronises once per measured step instead of at every
phase boundary.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class Clock:
    """Wall-clock marks (``time.perf_counter``); the CPU default."""

    kind = "wall"

    def mark(self) -> Any:
        """A point in time on this clock."""
        return time.perf_counter()

    def resolve(self, last: Any) -> None:
        """Make every mark up to ``last`` measurable (no-op for wall time)."""

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two marks (after :meth:`resolve`)."""
        return (end - start) * 1000.0


class CudaClock(Clock):
    """CUDA events on the current stream: phases measure the GPU stream's own timeline.

    Why events: a wall clock on the host sees only launch time, since kernels run
    asynchronously; events recorded at each phase boundary partition the stream's timeline
    exactly, so the five phases still sum to the step time. ``resolve`` waits on the step's
    last event, the single synchronisation per measured step.
    """

    kind = "cuda-events"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def resolve(self, last: Any) -> None:
        last.synchronize()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))


def clock_for(device: torch.device | None) -> Clock:
    """The right clock for a device: CUDA events on a CUDA device, wall time otherwise."""
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        return CudaClock(device)
    return Clock()

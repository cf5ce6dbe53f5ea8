"""Per-step memory: CUDA allocator peaks (allocated, reserved) and process RSS.

On CPU there is no allocator statistics API (TORCH-FACTS.md), so per-step figures are RSS; the
allocator-level peak comes from the profiler window's memory events instead.
"""

from __future__ import annotations

import psutil
import torch

from torchscalpel.record import StepRecord


class StepMemory:
    """Resets CUDA peak statistics at each step start and reads them at its end."""

    def __init__(self, device: torch.device | None) -> None:
        self.cuda = device is not None and device.type == "cuda" and torch.cuda.is_available()
        self.device = device
        self._process = psutil.Process()

    def open_step(self) -> None:
        """Start a step's peak window. Note: this resets the script's own CUDA peak statistics too."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def close_step(self, step: StepRecord) -> None:
        """Write the step's peaks (host-side allocator counters: no device sync needed)."""
        if self.cuda:
            step.cuda_allocated_peak = int(torch.cuda.max_memory_allocated(self.device))
            step.cuda_reserved_peak = int(torch.cuda.max_memory_reserved(self.device))
        try:
            step.rss = int(self._process.memory_info().rss)
        except psutil.Error:
            step.rss = None

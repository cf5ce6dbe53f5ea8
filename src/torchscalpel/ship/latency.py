"""Latency of each form of the model at a given batch: median over repeated calls.

Variants are measured interleaved (round-robin), so a neighbour's load on shared cores hits them
all alike and the ratios stay meaningful even when the absolute figures move.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import numpy as np

from torchscalpel.ship.runners import Runner


def measure_latency(
    runners: Sequence[Runner],
    inputs: Sequence[np.ndarray],
    *,
    warmup: int = 2,
    rounds: int = 15,
    budget_s: float = 1.0,
) -> dict[str, float]:
    """Median milliseconds per call for each runner on the same inputs (interleaved rounds)."""
    for runner in runners:
        for _ in range(warmup):
            runner(inputs)
    samples: dict[str, list[float]] = {r.name: [] for r in runners}
    start = time.perf_counter()
    for i in range(rounds):
        for runner in runners:
            t0 = time.perf_counter()
            runner(inputs)
            samples[runner.name].append((time.perf_counter() - t0) * 1e3)
        # At least 3 rounds for a median; then stop when the budget is spent (big models, slow CPUs).
        if i >= 2 and time.perf_counter() - start > budget_s:
            break
    return {name: round(statistics.median(v), 4) for name, v in samples.items()}

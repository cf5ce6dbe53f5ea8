"""The largest per-rank batch that fits, per strategy.

Activation memory is close to linear in the batch, so two simulations (batch b and 2b) give each
strategy's peak as ``a + k * batch``; the solved batch is then checked with a simulation of its own
and stepped down (by the fitted slope, then 10 %) until it fits, so the answer is a measured one.
"""

from __future__ import annotations

from collections.abc import Callable

from torchscalpel.plan.devices import Device
from torchscalpel.plan.simulate import Measurement
from torchscalpel.plan.strategies import evaluate

MAX_BATCH = 1 << 20
Measure = Callable[[int], Measurement]


def max_batch(
    measure: Measure, base: Measurement, strategy: str, *, world_size: int, nodes: int, device: Device,
    checkpointing: bool, tries: int = 4, second: Measurement | None = None,
) -> int:
    """Largest batch whose peak fits ``device`` under ``strategy`` (0 when not even batch 1 fits)."""
    limit = device.usable_for_allocations()

    def peak(m: Measurement) -> int:
        return evaluate(m, strategy, world_size=world_size, nodes=nodes, device=device, checkpointing=checkpointing).peak

    b0 = base.batch
    p0 = peak(base)
    other = second if second is not None else measure(2 * b0)
    p1 = peak(other)
    slope = max((p1 - p0) / max(1, other.batch - b0), 1.0)
    fixed = p0 - slope * b0
    guess = int((limit - fixed) // slope)
    guess = max(0, min(guess, MAX_BATCH))
    for _ in range(tries):
        if guess <= 0:
            return 0
        m = (base if guess == b0 else other) if guess in (b0, other.batch) else measure(guess)
        p = peak(m)
        if p <= limit:
            return guess
        over = p - limit
        guess = min(int(guess - over / slope) - 1, int(guess * 0.9))
    return max(0, guess) if guess > 0 and peak(measure(guess)) <= limit else 0

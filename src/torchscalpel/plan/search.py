"""The largest per-rank batch that fits, per strategy.

The peak is monotone in the batch but not linear: at small batches the optimizer step (batch
independent) is the peak, at large ones backward. So the search brackets the answer with measured
simulations (the linear extrapolation of batch b and 2b as the first guess, then doubling or
halving) and narrows the bracket by interpolation and bisection to within 2 %. Every answer is a
batch whose own simulation fits.
"""

from __future__ import annotations

from collections.abc import Callable

from torchscalpel.plan.devices import Device
from torchscalpel.plan.simulate import Measurement
from torchscalpel.plan.strategies import evaluate

MAX_BATCH = 1 << 20
TOLERANCE = 0.02
Measure = Callable[[int], Measurement]


def max_batch(
    measure: Measure,
    base: Measurement,
    strategy: str,
    *,
    world_size: int,
    nodes: int,
    device: Device,
    checkpointing: bool,
    max_sims: int = 14,
    cpu_offload: bool = False,
    replicated_bytes: int = 0,
) -> int:
    """Largest batch whose peak fits ``device`` under ``strategy`` (0 when not even batch 1 fits)."""
    limit = device.usable_for_allocations()
    sims = 0

    def peak(batch: int) -> int:
        nonlocal sims
        sims += 1
        m = base if batch == base.batch else measure(batch)
        return evaluate(
            m,
            strategy,
            world_size=world_size,
            nodes=nodes,
            device=device,
            checkpointing=checkpointing,
            cpu_offload=cpu_offload,
            replicated_bytes=replicated_bytes,
        ).peak

    b0, p0 = base.batch, peak(base.batch)
    if p0 > limit:
        if b0 == 1 or peak(1) > limit:
            return 0  # not even one sample fits: skip the search
        lo, hi, p_lo, p_hi = 1, b0, peak(1), p0
    else:
        lo, p_lo = b0, p0
        b1 = min(2 * b0, MAX_BATCH)
        p1 = peak(b1)
        if p1 <= limit:
            slope = max((p1 - p0) / max(1, b1 - b0), 1.0)
            guess = min(MAX_BATCH, max(b1 + 1, int(b0 + (limit - p0) / slope)))
            lo, p_lo = b1, p1
            hi, p_hi = guess, peak(guess)
            while p_hi <= limit and hi < MAX_BATCH:
                lo, p_lo = hi, p_hi
                hi = min(MAX_BATCH, hi * 2)
                p_hi = peak(hi)
            if p_hi <= limit:
                return hi
        else:
            hi, p_hi = b1, p1
    # invariant: peak(lo) fits, peak(hi) does not
    use_interp = True
    while hi - lo > max(1, int(lo * TOLERANCE)) and sims < max_sims:
        if use_interp and p_hi > p_lo:
            cand = lo + int((limit - p_lo) * (hi - lo) / (p_hi - p_lo))
            span = hi - lo
            cand = min(max(cand, lo + max(1, span // 10)), hi - max(1, span // 10))
        else:
            cand = (lo + hi) // 2
        use_interp = not use_interp
        if cand <= lo or cand >= hi:
            cand = (lo + hi) // 2
            if cand <= lo:
                break
        p = peak(cand)
        if p <= limit:
            lo, p_lo = cand, p
        else:
            hi, p_hi = cand, p
    return lo

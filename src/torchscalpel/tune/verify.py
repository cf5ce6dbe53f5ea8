"""The numerics gate and the speed decision: when a candidate may be recommended.

Numerics: with the same seed, a candidate's losses over the first steps must stay within a
relative tolerance of the baseline's. The tolerance depends on the loosest knob in the candidate
(exact knobs tight, reordered float32 arithmetic looser, bf16 loosest), and never drops below
three times the deviation between two runs of the baseline itself (a script that is not
deterministic cannot be held to a tighter bound than it keeps).

Speed: a candidate wins only when its median step time beats the baseline's by a margin beyond
the noise measured between consecutive baseline repeats.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from torchscalpel.tune.knobs import CLOSE, EXACT, LOW_PRECISION

TOLERANCES: dict[str, float] = {
    EXACT: 1e-4,  # threads / data loading: only summation order changes
    CLOSE: 2e-3,  # compile / fused optimizer / TF32: fused and reordered float32 arithmetic
    LOW_PRECISION: 5e-2,  # bf16 autocast: 8-bit mantissa in matmuls, float32 loss
}
"""Maximum relative loss deviation from the baseline, per numerics class."""

GATE_STEPS = 10
"""How many of the first steps the gate compares (errors compound later, by design of training)."""

MIN_MARGIN = 0.03
"""A candidate must be at least 3% faster than the baseline, or more when the noise is larger."""


@dataclass(kw_only=True, slots=True)
class GateResult:
    """Outcome of the numerics gate for one candidate."""

    passed: bool
    deviation: float | None
    """Largest relative loss deviation over the compared steps (None: nothing to compare)."""
    tolerance: float
    steps: int
    """Steps compared."""
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


def loss_deviation(
    baseline: Sequence[float | None], candidate: Sequence[float | None], steps: int = GATE_STEPS
) -> tuple[float | None, int]:
    """Largest ``|candidate - baseline| / max(|baseline|, 1e-6)`` over the first ``steps`` steps.

    Returns ``(deviation, steps compared)``; a non-finite candidate loss where the baseline is
    finite counts as infinite deviation. Steps where either has no loss are skipped.
    """
    worst: float | None = None
    compared = 0
    for b, c in list(zip(baseline, candidate, strict=False))[:steps]:
        if b is None or c is None or not math.isfinite(b):
            continue
        compared += 1
        dev = math.inf if not math.isfinite(c) else abs(c - b) / max(abs(b), 1e-6)
        worst = dev if worst is None else max(worst, dev)
    return worst, compared


def numerics_gate(
    baseline: Sequence[float | None],
    candidate: Sequence[float | None],
    numerics: str,
    *,
    noise: float = 0.0,
    steps: int = GATE_STEPS,
) -> GateResult:
    """Pass when the candidate's losses track the baseline's within the class tolerance (or 3x noise)."""
    tolerance = max(TOLERANCES[numerics], 3.0 * noise)
    deviation, compared = loss_deviation(baseline, candidate, steps)
    if deviation is None:
        return GateResult(
            passed=False,
            deviation=None,
            tolerance=tolerance,
            steps=0,
            reason="no losses to compare (the script called backward on nothing the runtime saw)",
        )
    if deviation <= tolerance:
        return GateResult(passed=True, deviation=deviation, tolerance=tolerance, steps=compared)
    what = "non-finite loss" if math.isinf(deviation) else f"loss deviates {deviation:.2e}"
    return GateResult(
        passed=False,
        deviation=deviation,
        tolerance=tolerance,
        steps=compared,
        reason=f"{what} > tolerance {tolerance:.1e} ({numerics}) over the first {compared} steps",
    )


def noise_fraction(medians: Sequence[float]) -> float:
    """Short-term noise of repeated baseline medians, in time order: the median relative difference
    between consecutive runs (slow drift of the machine's load cancels in paired comparisons, so it
    does not count). 0 for fewer than two runs."""
    values = [m for m in medians if m and m > 0]
    if len(values) < 2:
        return 0.0
    diffs = [abs(a - b) / ((a + b) / 2) for a, b in itertools.pairwise(values)]
    return statistics.median(diffs)


def required_speedup(noise: float) -> float:
    """The speedup a candidate must show: 1 + max(MIN_MARGIN, noise)."""
    return 1.0 + max(MIN_MARGIN, noise)

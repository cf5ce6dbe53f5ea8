"""The numerics gate and the speed margin."""

from __future__ import annotations

import math

import pytest

from torchscalpel.tune.verify import (
    MIN_MARGIN,
    TOLERANCES,
    loss_deviation,
    noise_fraction,
    numerics_gate,
    required_speedup,
)

BASE = [4.0, 3.5, 3.0, 2.8, 2.5]


def test_identical_losses_pass_the_tight_gate():
    gate = numerics_gate(BASE, list(BASE), "exact")
    assert gate.passed and gate.deviation == 0.0 and gate.steps == 5


def test_exact_gate_rejects_what_bf16_gate_accepts():
    cand = [v * 1.01 for v in BASE]  # 1% off
    exact = numerics_gate(BASE, cand, "exact")
    assert not exact.passed and "deviates 1.00e-02" in exact.reason and "(exact)" in exact.reason
    assert numerics_gate(BASE, cand, "bf16").passed


def test_bf16_gate_rejects_diverging_curve():
    cand = [*BASE[:3], 2.8 * 1.2, 2.5]
    gate = numerics_gate(BASE, cand, "bf16")
    assert not gate.passed and gate.deviation == pytest.approx(0.2)


def test_nan_loss_fails_with_reason():
    gate = numerics_gate(BASE, [4.0, float("nan"), 3.0], "bf16")
    assert not gate.passed and math.isinf(gate.deviation) and "non-finite" in gate.reason


def test_gate_compares_only_first_steps():
    base = [1.0] * 20
    cand = [1.0] * 10 + [2.0] * 10
    assert numerics_gate(base, cand, "exact", steps=10).passed
    assert not numerics_gate(base, cand, "exact", steps=11).passed


def test_noise_floor_widens_tolerance():
    cand = [v * 1.001 for v in BASE]
    assert not numerics_gate(BASE, cand, "exact").passed
    gate = numerics_gate(BASE, cand, "exact", noise=5e-4)
    assert gate.passed and gate.tolerance == pytest.approx(1.5e-3)


def test_no_losses_fails():
    gate = numerics_gate([None, None], [None, None], "exact")
    assert not gate.passed and gate.steps == 0


def test_missing_steps_are_skipped():
    dev, n = loss_deviation([1.0, None, 2.0], [1.0, 5.0, 2.0])
    assert dev == 0.0 and n == 2


def test_tolerances_ordered():
    assert TOLERANCES["exact"] < TOLERANCES["close"] < TOLERANCES["bf16"]


def test_speed_margin():
    assert noise_fraction([100.0, 110.0, 105.0]) == pytest.approx((10 / 105 + 5 / 107.5) / 2)
    assert noise_fraction([100.0, 200.0, 300.0, 400.0]) == pytest.approx(100 / 250)  # drift: consecutive only
    assert noise_fraction([100.0]) == 0.0
    assert required_speedup(0.0) == 1 + MIN_MARGIN
    assert required_speedup(0.2) == pytest.approx(1.2)


def test_one_speedup_per_candidate_from_its_pairs():
    from torchscalpel.tune.speedup import speedup_of

    screened = speedup_of({"verdict": "faster", "baseline_ms": 100.0, "median_ms": 50.0})
    assert screened.ratio == 2.0 and not screened.confirmed and screened.low is None
    assert screened.spread_text().startswith("not measured")
    assert speedup_of({"verdict": "failed", "baseline_ms": 100.0, "median_ms": None}).ratio is None
    # confirmed: the pair with the median ratio (an actual pair, so ratio == baseline / candidate shown)
    confirmed = speedup_of(
        {
            "verdict": "winner",
            "baseline_ms": 100.0,
            "median_ms": 61.0,
            "confirm_pairs": [[100.0, 50.0], [200.0, 100.0], [90.0, 100.0]],
        }
    )
    assert (confirmed.ratio, confirmed.baseline_ms, confirmed.candidate_ms) == (2.0, 100.0, 50.0)
    assert (confirmed.low, confirmed.high) == (
        0.9,
        2.0,
    ) and confirmed.spread_text() == "0.90-2.00x over 3 pairs"
    # an even count takes the lower of the middle two: never the flattering one
    assert speedup_of({"verdict": "x", "confirm_pairs": [[120.0, 100.0], [150.0, 100.0]]}).ratio == 1.2

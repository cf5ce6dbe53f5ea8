"""scalpel fix --verify's judgement of a patched-vs-original ratio against tune's confirmed ratio and
spread, on given numbers (no timing): below the spread's low end fails, within or above passes."""

from __future__ import annotations

from torchscalpel.fix.judge import judge
from torchscalpel.tune.speedup import speedup_of


def _pairs(*ratios: float) -> list[list[float]]:
    return [[10.0 * r, 10.0] for r in ratios]


TUNE = speedup_of({"confirm_pairs": _pairs(1.30, 1.20, 1.40)})  # 1.30x, spread 1.20-1.40x


def test_below_the_spread_fails_with_both_numbers() -> None:
    verdict = judge(speedup_of({"confirm_pairs": _pairs(1.10, 1.15, 1.05)}), TUNE)
    assert not verdict.ok and verdict.floor == 1.20
    assert verdict.reason == (
        "patched vs original 1.10x is below the low end of tune's confirmed 1.30x (spread 1.20-1.40x)"
    )


def test_within_and_above_the_spread_pass() -> None:
    within = judge(speedup_of({"confirm_pairs": _pairs(1.22, 1.25, 1.21)}), TUNE)
    above = judge(speedup_of({"confirm_pairs": _pairs(1.9, 1.8, 2.0)}), TUNE)
    assert within.ok and "1.22x is within tune's confirmed 1.30x" in within.reason
    assert above.ok and "1.90x is above" in above.reason
    # the lower-median pair is judged: one lucky pair does not carry two slow ones
    assert not judge(speedup_of({"confirm_pairs": _pairs(1.5, 1.1, 1.1)}), TUNE).ok


def test_without_a_tune_spread_only_a_speedup_is_required_and_it_says_so() -> None:
    screened = speedup_of({"baseline_ms": 13.0, "median_ms": 10.0})  # one screening pair: no spread
    assert judge(speedup_of({"confirm_pairs": _pairs(1.05)}), screened).ok
    slower = judge(speedup_of({"confirm_pairs": _pairs(0.97)}), screened)
    assert not slower.ok and "has no spread (spread not measured: one pair)" in slower.reason


def test_nothing_measured_is_not_verified() -> None:
    assert not judge(speedup_of({"confirm_pairs": []}), TUNE).ok
    missing = judge(speedup_of({"confirm_pairs": _pairs(1.3)}), None)
    assert not missing.ok and "no confirmed ratio" in missing.reason and missing.floor is None


def test_the_cli_defaults_are_fix_options_defaults() -> None:
    """cli/fix.py keeps its own copy (importing fix.options would load the fix package for every command)."""
    from torchscalpel.cli import fix as cli_fix
    from torchscalpel.fix import options

    assert (cli_fix.VERIFY_PAIRS, cli_fix.VERIFY_STEPS) == (options.VERIFY_PAIRS, options.VERIFY_STEPS)

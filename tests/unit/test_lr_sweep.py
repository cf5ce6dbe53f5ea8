"""The LR range test's math on synthetic loss curves: schedule, smoothing, divergence, suggestion."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from torchscalpel.lrfind.coverage import coverage, log_share, more_steps_advice, short_reason, step_flags
from torchscalpel.lrfind.options import LrOptions
from torchscalpel.lrfind.sweep import Smoother, gradient, min_over_10, schedule, smooth, suggest


def test_schedule_is_exponential_and_hits_both_ends() -> None:
    lrs = schedule(1e-7, 10.0, 100)
    assert len(lrs) == 100
    assert lrs[0] == pytest.approx(1e-7) and lrs[-1] == pytest.approx(10.0)
    ratios = {round(b / a, 9) for a, b in itertools.pairwise(lrs)}
    assert len(ratios) == 1  # one constant ratio: evenly spaced in log


def test_smoothing_is_bias_corrected() -> None:
    # a constant loss stays constant from the first point (no pull towards 0 from the zero start)
    assert smooth([2.0] * 5, 0.98) == pytest.approx([2.0] * 5)
    # the EMA by hand for two points
    beta = 0.9
    avg1 = (1 - beta) * 1.0
    avg2 = beta * avg1 + (1 - beta) * 3.0
    assert smooth([1.0, 3.0], beta) == pytest.approx([avg1 / (1 - beta), avg2 / (1 - beta**2)])


def test_divergence_at_four_times_the_minimum() -> None:
    s = Smoother(0.0, 4.0)  # beta 0: smoothed == loss, so the rule is read directly
    assert s.add(1.0) == (1.0, False)
    assert s.add(0.5) == (0.5, False)
    assert s.add(2.0) == (2.0, False)  # exactly 4x is not above
    assert s.add(2.01)[1] is True
    nan = Smoother(0.98, 4.0)
    nan.add(1.0)
    smoothed, diverged = nan.add(math.inf)
    assert diverged and math.isnan(smoothed)


def test_gradient_matches_torch_on_uneven_spacing() -> None:
    xs = [0.0, 0.5, 1.7, 2.0, 3.5, 5.0]
    ys = [1.0, 0.8, 0.3, 0.35, 0.1, 2.0]
    expected = torch.gradient(
        torch.tensor(ys, dtype=torch.float64), spacing=[torch.tensor(xs, dtype=torch.float64)]
    )[0]
    assert gradient(ys, xs) == pytest.approx(expected.tolist())


def _curve(centre: float, lrs: list[float]) -> list[float]:
    """A sigmoid drop in log lr, steepest at ``centre``, then a blow-up past 100x ``centre``."""
    return [
        2.0 - math.tanh(math.log(lr / centre)) + (0.0 if lr < 100 * centre else (lr / (100 * centre)) ** 2)
        for lr in lrs
    ]


@pytest.mark.parametrize("centre", [1e-4, 3e-3, 0.1])
def test_suggestion_is_the_steepest_descent(centre: float) -> None:
    lrs = schedule(1e-7, 10.0, 100)
    found = suggest(lrs, _curve(centre, lrs))
    assert found is not None and found.slope < 0
    ratio = (10.0 / 1e-7) ** (1 / 99)  # one step of the sweep
    assert centre / ratio <= found.lr <= centre * ratio


def test_a_fall_after_a_spike_is_not_the_suggestion() -> None:
    # the loss falls around 1e-3, reaches its minimum, spikes, then the average "recovers" even faster
    lrs = schedule(1e-6, 10.0, 60)
    losses = [2.0 - 0.5 * math.tanh(math.log(lr / 1e-3)) for lr in lrs]
    for i in range(45, 50):
        losses[i] = 6.0
    for i in range(50, 60):
        losses[i] = 6.0 - 0.3 * (i - 49)  # a steep fall after the spike, still above the minimum
    found = suggest(lrs, losses)
    assert found is not None
    assert 3e-4 <= found.lr <= 3e-3


def test_no_suggestion_when_the_loss_never_falls() -> None:
    lrs = schedule(1e-5, 1.0, 30)
    assert suggest(lrs, [1.0 + 0.01 * i for i in range(30)]) is None
    assert suggest(lrs[:2], [1.0, 0.9]) is None  # one point left once the last is skipped


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_lr": 0.0}, "--min must be a positive finite"),
        ({"max_lr": math.nan}, "--max must be a positive finite"),
        ({"min_lr": 1.0, "max_lr": 0.1}, "must be below --max"),
        ({"steps": 3}, "--steps must be a whole number of at least 8"),
    ],
)
def test_options_refuse_bad_sweeps(kwargs: dict[str, float], message: str) -> None:
    from torchscalpel.options import usage_error

    with pytest.raises(ValueError) as info:
        LrOptions(**kwargs)  # type: ignore[arg-type]
    assert message in str(usage_error(info.value))  # the CLI's words: the flags
    assert "--" not in str(info.value) and next(iter(kwargs)) in str(info.value)  # the library's: the fields


def test_lightnings_rule_weighs_the_small_lrs() -> None:
    # Lightning 2.x takes the slope against the linear lr: on a log sweep a tiny wobble at a tiny lr
    # outweighs the real descent a decade later; the log-axis rule finds the descent
    lrs = schedule(1e-7, 10.0, 100)
    losses = _curve(1e-2, lrs)
    losses[20] -= 1e-3  # noise where the curve is flat (lr ~ 4e-6)
    log_rule = suggest(lrs, losses)
    linear_rule = suggest(lrs, losses, axis="linear", descent_only=False)
    assert log_rule is not None and linear_rule is not None
    assert 5e-3 <= log_rule.lr <= 2e-2
    assert linear_rule.lr < 1e-5


def test_min_over_10_is_the_smoothed_minimums_lr_over_ten() -> None:
    """A curve flat at 2, falling to 0.5 at lr 1e-2, then rising: minimum / 10 is 1e-3; a lower
    value in the skipped first points and a non-finite last point do not count."""
    lrs = schedule(1e-6, 1.0, 61)  # 10 points per decade: lrs[40] = 1e-2
    smoothed = [2.0 - 1.5 * math.exp(-(((math.log10(lr) + 2) / 0.8) ** 2)) for lr in lrs]
    smoothed[0] = 0.1  # settling average: skipped
    smoothed[-1] = math.nan
    got = min_over_10(lrs, smoothed)
    assert got is not None
    assert got[0] == 40 and got[1] == pytest.approx(1e-3)
    assert min_over_10([1e-3, 1e-2], [math.nan, math.nan]) is None


def test_options_refuse_a_schedule_that_overflows() -> None:
    """--max 1e308 from 1e-7 is finite, but the sweep's ratio max/min is not: it swept lr = inf before."""
    with pytest.raises(ValueError, match=r"^max_lr 1e\+308 is 315 decades above min_lr 1e-07: .*overflows"):
        LrOptions(max_lr=1e308)
    with pytest.raises(ValueError, match="overflows"):
        LrOptions(min_lr=5e-324, max_lr=1.0)  # the same ratio, from a denormal --min
    wide = LrOptions(min_lr=1.0, max_lr=1e300)  # far, but every lr of its schedule is a float
    assert all(math.isfinite(lr) for lr in schedule(wide.min_lr, wide.max_lr, wide.steps))


def test_coverage_of_a_short_sweep() -> None:
    lrs = schedule(1e-7, 10.0, 100)
    short = coverage(lrs[:20], min_lr=1e-7, max_lr=10.0, steps=100, diverged=False)
    assert short.steps_run == 20 and short.reached_lr == lrs[19]
    assert short.share == pytest.approx(19 / 99) and not short.covered and not short.measured
    assert coverage(
        lrs[:20], min_lr=1e-7, max_lr=10.0, steps=100, diverged=True
    ).measured  # stopped by divergence
    whole = coverage(lrs, min_lr=1e-7, max_lr=10.0, steps=100, diverged=False)
    assert whole.covered and whole.measured and whole.share == pytest.approx(1.0)
    assert coverage([], min_lr=1e-7, max_lr=10.0, steps=100, diverged=False).share == 0.0
    assert log_share(1e-3, 1e-7, 10.0) == pytest.approx(0.5)
    reason = short_reason(short, "the script ended")
    assert reason.startswith("the script ended after 20 of the sweep's 100 steps, at lr 3.43e-06 (19% of the")
    with pytest.raises(ValueError):
        short_reason(whole, "the script ended")


def test_the_advice_names_the_scripts_own_arguments_and_steps() -> None:
    lrs = schedule(1e-7, 10.0, 100)
    short = coverage(lrs[:20], min_lr=1e-7, max_lr=10.0, steps=100, diverged=False)
    advice = more_steps_advice(short, ["--epochs", "--batches"], min_steps=8)
    assert "its --epochs, --batches arguments" in advice and "at least 100 optimizer steps" in advice
    assert "scalpel lr --steps 20 " in advice
    tiny = coverage(lrs[:5], min_lr=1e-7, max_lr=10.0, steps=100, diverged=False)
    assert "--steps" not in more_steps_advice(
        tiny, [], min_steps=8
    )  # 5 points are below the fewest a sweep takes
    assert "more epochs or batches" in more_steps_advice(tiny, [], min_steps=8)


def test_step_flags_are_the_arguments_that_lengthen_training() -> None:
    source = (
        "import argparse\np = argparse.ArgumentParser()\n"
        "p.add_argument('--batch-size', type=int)\np.add_argument('-e', '--epochs', type=int)\n"
        "p.add_argument('--eval_iters', type=int)\np.add_argument('--warmup-steps', type=int)\n"
        "p.add_argument('--max_iters', type=int)\np.add_argument('--log-interval', type=int)\n"
        "p.add_argument('--train-batches', type=int)\n"
    )
    assert step_flags(source) == ["--epochs", "--max_iters", "--train-batches"]
    assert step_flags("def broken(:\n") == []

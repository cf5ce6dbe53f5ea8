"""The range test's math, free of torch and of the runtime: the schedule, the smoothing, the
divergence rule and the suggestion. Unit-tested on synthetic loss curves.

The rules are the ones Lightning's ``Tuner.lr_find`` and fastai's ``lr_find`` use, so the two can be
compared on one model: an exponential sweep, an exponential moving average of the loss with bias
correction (beta 0.98), a stop when the smoothed loss exceeds 4x its minimum, and the suggestion at
the steepest descent of the smoothed loss, skipping the first points (the average is still settling)
and the last one (the divergence itself).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def schedule(min_lr: float, max_lr: float, steps: int) -> list[float]:
    """``steps`` learning rates from ``min_lr`` to ``max_lr`` (both included), evenly spaced in log."""
    if steps < 2:
        raise ValueError("a sweep needs at least 2 steps")
    ratio = max_lr / min_lr
    return [min_lr * ratio ** (k / (steps - 1)) for k in range(steps)]


class Smoother:
    """The bias-corrected exponential moving average, fed one loss at a time, with the divergence rule."""

    def __init__(self, beta: float, divergence_factor: float) -> None:
        self.beta = beta
        self.factor = divergence_factor
        self._avg = 0.0
        self._n = 0
        self.best = math.inf
        """The smallest smoothed loss so far."""

    def add(self, loss: float) -> tuple[float, bool]:
        """The smoothed value after ``loss``, and whether the sweep has now diverged.

        Diverged: the loss is not finite, or (from the second point on) the smoothed loss exceeds
        ``divergence_factor`` times the smallest smoothed loss before it.
        """
        self._n += 1
        if not math.isfinite(loss):
            return math.nan, True
        self._avg = self.beta * self._avg + (1 - self.beta) * loss
        smoothed = self._avg / (1 - self.beta**self._n) if self.beta else loss
        diverged = self._n > 1 and self.best > 0 and smoothed > self.factor * self.best
        self.best = min(self.best, smoothed)
        return smoothed, diverged


def smooth(losses: Sequence[float], beta: float) -> list[float]:
    """Every point of :class:`Smoother` over ``losses`` (the divergence rule not applied)."""
    s = Smoother(beta, math.inf)
    return [s.add(x)[0] for x in losses]


def gradient(ys: Sequence[float], xs: Sequence[float]) -> list[float]:
    """dy/dx at every point: second-order central differences on uneven spacing inside, one-sided
    at the two ends (what ``torch.gradient(ys, spacing=[xs])`` and ``numpy.gradient`` compute)."""
    n = len(ys)
    if n < 2 or len(xs) != n:
        raise ValueError("gradient needs at least 2 points and one x per y")
    out = [(ys[1] - ys[0]) / (xs[1] - xs[0])]
    for i in range(1, n - 1):
        hl, hr = xs[i] - xs[i - 1], xs[i + 1] - xs[i]
        out.append((hl**2 * ys[i + 1] - hr**2 * ys[i - 1] + (hr**2 - hl**2) * ys[i]) / (hl * hr * (hl + hr)))
    out.append((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
    return out


@dataclass(frozen=True, slots=True)
class Suggestion:
    """Where the smoothed loss falls fastest."""

    index: int
    """Position in the swept points."""
    lr: float
    slope: float
    """d(smoothed loss)/d(ln lr) there (negative; per lr on the linear axis)."""


def skip_begin_for(points: int) -> int:
    """Points skipped at the start: 10 (Lightning's default) when the sweep has 50 or more, else a fifth."""
    return min(10, points // 5)


def suggest(
    lrs: Sequence[float],
    smoothed: Sequence[float],
    *,
    skip_end: int = 1,
    axis: str = "log",
    descent_only: bool = True,
) -> Suggestion | None:
    """The learning rate at the steepest negative slope of ``smoothed`` against ln(lr), at or before
    the smoothed loss's minimum.

    Only the descent counts: after a spike the smoothed loss can fall again as the average recovers
    (seen on the corpus MLP: the loss jumped to 31 at lr 2.7 and the steepest fall came after it, at
    lr 5.7); that is the average catching up, not a learning rate that trains.

    The slope is taken on the log axis the sweep is spaced (and plotted) on: on a linear lr axis an
    exponential sweep's early points, a millionth of the way along, weigh a millionfold (Lightning
    2.x differentiates against the linear lr; the benchmark shows what that changes). Non-finite
    points are left out. None when fewer than 2 points remain or the loss never falls.

    ``axis="linear", descent_only=False`` is Lightning 2.x's rule (``_LRFinder.suggestion``), kept for
    the benchmark's comparison of the two rules on one curve.
    """
    if axis not in ("log", "linear"):
        raise ValueError(f"axis must be 'log' or 'linear', got {axis!r}")
    if len(lrs) != len(smoothed):
        raise ValueError("one smoothed loss per learning rate")
    begin = skip_begin_for(len(lrs))
    end = len(lrs) - skip_end
    kept = [i for i in range(begin, end) if math.isfinite(smoothed[i]) and lrs[i] > 0]
    if kept and descent_only:
        lowest = min(kept, key=lambda i: smoothed[i])
        kept = [i for i in kept if i <= lowest]
    if len(kept) < 2:
        return None
    xs = [math.log(lrs[i]) if axis == "log" else lrs[i] for i in kept]
    slopes = gradient([smoothed[i] for i in kept], xs)
    j = min(range(len(kept)), key=lambda k: slopes[k])
    if slopes[j] >= 0:
        return None
    return Suggestion(index=kept[j], lr=lrs[kept[j]], slope=slopes[j])


def min_over_10(
    lrs: Sequence[float], smoothed: Sequence[float], *, skip_end: int = 1
) -> tuple[int, float] | None:
    """fastai's other rule: the lr at the smoothed loss's minimum, divided by 10, as (index of the minimum, lr / 10).

    The points considered are the ones :func:`suggest` considers (the first ones skipped while the
    average settles, the last one, the divergence itself, skipped; non-finite ones left out). None when
    none remain. Measured against the steepest-descent pick in BENCHMARKS.md ("Which suggestion trains
    better").
    """
    if len(lrs) != len(smoothed):
        raise ValueError("one smoothed loss per learning rate")
    begin = skip_begin_for(len(lrs))
    kept = [i for i in range(begin, len(lrs) - skip_end) if math.isfinite(smoothed[i]) and lrs[i] > 0]
    if not kept:
        return None
    lowest = min(kept, key=lambda i: smoothed[i])
    return lowest, lrs[lowest] / 10

"""Verdicts on a validation curve, torch-free: what ``val-loss-*`` doctor rules report
(:mod:`torchscalpel.doctor.rules.rt_eval_curve`) and what the report prints beside the curve.

:func:`judge` reads the loss of each evaluation pass (``record.sections["eval"]``,
:mod:`torchscalpel.runtime.eval_loss`) beside the training loss of the steps around them. A curve of fewer
than :data:`MIN_PASSES` usable passes gives no verdict: nothing is said rather than guessed. One verdict per
run, the first that holds in this order:

- overfitting: after its best pass the validation loss rose by :data:`RISE` or more and stayed up over the
  last two passes, while the training loss over the same steps fell by :data:`TRAIN_FALL` or more;
- oscillating: the passes jump up and down: the median distance of a pass from the midpoint of its
  neighbours is :data:`SWING` of the loss or more (a falling or a U-shaped curve stays near it);
- plateau: the last passes (half the curve, at least three) are flat within :data:`FLAT` and none improves
  on the best before them by more than :data:`GAIN`.

Passes after every training step (a median gap under :data:`MIN_GAP`) get no verdict either: that is a
no-grad loss inside the training loop, not an evaluation. A pass with far fewer loss calls than the others
(Lightning's two-batch sanity check before training) is not a point of the curve (:func:`usable_passes`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

OVERFITTING = "val-loss-overfitting"
OSCILLATING = "val-loss-oscillating"
PLATEAU = "val-loss-plateau"
"""The verdicts' slugs (the doctor rules that report them)."""

MIN_PASSES = 5
"""Usable evaluation passes below which no verdict is given."""
MIN_GAP = 2
"""Median training steps between passes below which no verdict is given: a "pass" after every step is a
no-grad loss inside the training loop (a frozen teacher's, a logged metric), not an evaluation schedule."""
RISE = 0.10
"""Overfitting: the validation loss ends this share above its best."""
TRAIN_FALL = 0.10
"""Overfitting: the training loss fell by this share between the best pass and the last."""
SWING = 0.08
"""Oscillation: the median distance of a pass from the midpoint of its two neighbours, as a share of the median
loss (a smooth curve, falling or turning up, stays within a few percent)."""
FLAT = 0.05
"""Plateau: the last passes' range, as a share of their mean."""
GAIN = 0.01
"""Plateau: an improvement on the earlier best below this share does not count."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`judge` concluded: the rule's slug and the figures its finding quotes."""

    slug: str
    figures: dict[str, float]


def usable_passes(passes: Sequence[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, loss) of the passes that are points of the curve: finite loss, and not a pass of far fewer
    batches than the typical one (a sanity check)."""
    good = [p for p in passes if isinstance(p.get("loss"), int | float) and isinstance(p.get("batches"), int)]
    if not good:
        return []
    typical = statistics.median(p["batches"] for p in good)
    return [(int(p["step"]), float(p["loss"])) for p in good if p["batches"] * 2 >= typical]


def _train_near(train: Sequence[tuple[int, float]], step: int, width: int) -> float | None:
    """The median training loss of the ``width`` steps before ``step`` (None when none was recorded)."""
    values = [loss for index, loss in train if step - width <= index < step]
    return statistics.median(values) if values else None


def judge(passes: Sequence[tuple[int, float]], train: Sequence[tuple[int, float]]) -> Verdict | None:
    """The verdict on a validation curve (``(step, loss)`` per pass, in run order) beside the training loss
    (``(step index, loss)``), or None: too few passes, or nothing wrong."""
    if len(passes) < MIN_PASSES:
        return None
    steps = [s for s, _ in passes]
    if statistics.median(b - a for a, b in pairwise(steps)) < MIN_GAP:
        return None
    losses = [v for _, v in passes]
    best_at = min(range(len(losses)), key=losses.__getitem__)
    best, last = losses[best_at], losses[-1]
    width = max(1, round((steps[-1] - steps[0]) / max(len(steps) - 1, 1)))
    after = losses[best_at + 1 :]
    if len(after) >= 2 and best > 0 and min(after[-2:]) >= best * (1 + RISE):
        train_best = _train_near(train, steps[best_at] + 1, width)
        train_last = _train_near(train, steps[-1] + 1, width)
        if train_best and train_last is not None and train_last <= train_best * (1 - TRAIN_FALL):
            return Verdict(
                OVERFITTING,
                {
                    "best": best,
                    "best_step": steps[best_at],
                    "last": last,
                    "last_step": steps[-1],
                    "train_best": train_best,
                    "train_last": train_last,
                    "passes": len(passes),
                },
            )
    # Each interior pass against the midpoint of its neighbours: a smooth curve (falling, or turning up)
    # stays near it whatever its slope; a loss that jumps up and down does not.
    wobble = [abs(v - (a + b) / 2) for a, v, b in zip(losses, losses[1:], losses[2:], strict=False)]
    middle = statistics.median(losses)
    swing = statistics.median(wobble)
    if middle > 0 and swing >= SWING * middle:
        diffs = [b - a for a, b in pairwise(losses)]
        flips = sum(1 for a, b in pairwise(diffs) if (a > 0) != (b > 0))
        return Verdict(
            OSCILLATING,
            {
                "swing": swing,
                "median": middle,
                "flips": flips,
                "changes": len(diffs) - 1,
                "passes": len(passes),
            },
        )
    tail_n = max(3, len(losses) // 2)
    if len(losses) >= 2 * 3 and len(losses) > tail_n:
        tail, before = losses[-tail_n:], losses[:-tail_n]
        mean = statistics.fmean(tail)
        earlier = min(before)
        if mean > 0 and (max(tail) - min(tail)) <= FLAT * mean and min(tail) >= earlier * (1 - GAIN):
            return Verdict(
                PLATEAU,
                {
                    "tail": tail_n,
                    "from_step": steps[-tail_n],
                    "last_step": steps[-1],
                    "best": min(losses),
                    "low": min(tail),
                    "high": max(tail),
                    "earlier": earlier,
                    "passes": len(passes),
                },
            )
    return None

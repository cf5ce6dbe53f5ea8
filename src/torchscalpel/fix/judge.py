"""Does the patched script reproduce the speedup tune confirmed? The judgement, on given numbers.

What is compared: the **whole training step**, optimizer step to optimizer step. Tune's figure is
:func:`torchscalpel.tune.speedup.speedup_of` of the winner: the lower-median pair of its interleaved
confirmation pairs (baseline run, candidate run), each run's median step time, and its spread is the
lowest and highest pair ratio. ``scalpel fix --verify`` measures the same way on the user's code:
``--pairs`` interleaved pairs of fresh plain-python processes (original, then patched), each run's
median interval between consecutive ``optimizer.step()`` calls (:mod:`torchscalpel.fix.steptimer`),
and the same :func:`speedup_of` over those pairs. No phase is compared on its own: the edit must pay
on the step the user waits for.

The verdict (:func:`judge`):

- tune confirmed a spread (two or more pairs): the patched ratio must not fall below the spread's low
  end. Within the spread or above it passes (above: the edit paid more than tune saw, which plain
  python without the trial's hooks may well show);
- tune measured no spread (one pair, or only a screening run): nothing says how far below its ratio
  is still the same effect, so the patched script must at least be faster (a ratio above 1.00x), and
  the verdict says the spread was not measured;
- tune has no figure, or the re-run measured no steps: not verified, saying which.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchscalpel.tune.speedup import Speedup


@dataclass(frozen=True, slots=True)
class Judgement:
    """The verdict on a patched-vs-original speedup against tune's confirmed one."""

    ok: bool
    reason: str
    """One sentence with the numbers: what was compared with what."""
    floor: float | None
    """The lowest patched ratio that passes (tune's spread low end, or 1.0 without a spread)."""


def judge(patched: Speedup, tune: Speedup | None) -> Judgement:
    """The verdict (see the module doc) of ``patched`` (patched vs original) against ``tune``."""
    if patched.ratio is None:
        return Judgement(False, "not measured: the re-runs measured no optimizer steps to compare", None)
    got = f"patched vs original {patched.text()}"
    if tune is None or tune.ratio is None:
        return Judgement(
            False, f"{got}, but tune recorded no confirmed ratio to reproduce (not measured)", None
        )
    if tune.low is None or tune.high is None:
        ok = patched.ratio > 1.0
        return Judgement(
            ok,
            f"{got} {'>' if ok else '<='} 1.00x; tune's {tune.text()} has no spread "
            "(spread not measured: one pair), so only a speedup is required",
            1.0,
        )
    spread = f"tune's confirmed {tune.text()} (spread {tune.low:.2f}-{tune.high:.2f}x)"
    if patched.ratio < tune.low:
        return Judgement(False, f"{got} is below the low end of {spread}", tune.low)
    where = "within" if patched.ratio <= tune.high else "above"
    return Judgement(True, f"{got} is {where} {spread}", tune.low)

"""Confirmation: the best configuration and the baseline run alternately, in interleaved pairs.

A candidate is recommended only if its speedup (:func:`torchscalpel.tune.speedup.speedup_of`: the
pair with the lower-median ratio) reaches ``1 + max(3 %, noise)`` and every single pair shows it
faster by at least 3 % (one lucky pair cannot carry it), and every confirmation run passes the numerics gate. The time comes from what
is left when confirmation starts; the budget's advice says what a too-small budget could not do.
"""

from __future__ import annotations

import statistics
from typing import Protocol

from torchscalpel.tune.apply import numerics_class
from torchscalpel.tune.budget import Budget
from torchscalpel.tune.options import Progress
from torchscalpel.tune.result import TuneResult
from torchscalpel.tune.runner import TrialResult
from torchscalpel.tune.settings import TuneSettings
from torchscalpel.tune.speedup import stamp
from torchscalpel.tune.states import Verdict
from torchscalpel.tune.verify import MIN_MARGIN, noise_fraction, numerics_gate, required_speedup

OUTLIER = 2.0
"""A failing pair whose ratio is below the screening ratio divided by this is not alone enough to rule
a candidate out: one more pair is run (seen: 0.11x in one pair after 2.66x screened)."""


class TrialRunner(Protocol):
    """What confirmation needs from the search that runs it."""

    budget: Budget
    progress: Progress
    baseline_medians: list[float]
    determinism: float
    confirm_pairs: int

    def trial(self, settings: TuneSettings, family: str, *, limit_s: float, tag: str = "") -> TrialResult:
        """Run one trial process (counted in "trial N of M")."""

    def plan(self, delta: int, why: str = "") -> None:
        """Add (or, negative, drop) runs from the plan shown as "trial N of M"."""


def confirm(search: TrialRunner, best: TrialResult, result: TuneResult) -> bool:
    """Interleave baseline and ``best``; recommend it (``result.winner``) only if it wins beyond the noise."""
    budget = search.budget
    if budget.remaining() < budget.pair_s(best):
        best.note = best.note or "not confirmed: budget spent"
        result.notes.append(f"{best.label} not confirmed: {budget.advice(best)}")
        return False
    search.progress.message(
        f"confirming {best.label} against the baseline in interleaved pairs "
        f"({max(0.0, budget.remaining()):.0f} s left)"
    )
    settings = TuneSettings.from_dict(best.settings)
    total = search.confirm_pairs
    search.plan(2 * total, f"confirming {best.label} in {total} interleaved pair(s) with the baseline")
    pairs: list[tuple[float, float]] = []
    ran = 0

    def drop(why: str) -> None:
        search.plan(-(2 * total - ran), why)

    screened = (best.baseline_ms / best.median_ms) if best.baseline_ms and best.median_ms else None
    outliers = 0
    startups: list[tuple[float, float]] = []
    compile_ms: list[float] = []
    short = False
    last_pair: tuple[float, float] | None = None
    """Wall seconds of the last pair run (baseline, candidate): what the next pair needs. The screening
    run's wall time held a cold compile (118 s of a 170 s compile trial on a tiny Llama; 66 s warm)."""
    for i in range(total):
        if pairs and budget.remaining() < (sum(last_pair) if last_pair else budget.pair_s(best)):
            short = True
            noise = noise_fraction(search.baseline_medians)
            advice = budget.advice(best, total - len(pairs), noise=noise, measured=last_pair)
            result.notes.append(
                f"confirmation of {best.label} stopped after {len(pairs)} of {total} pair(s), so it is not "
                f"recommended (one pair cannot carry it): {advice}"
            )
            drop(f"confirmation of {best.label} stopped after {len(pairs)} pair(s) (budget)")
            break
        # The confirmation may overrun the budget slightly rather than kill a run half-way:
        # each run gets at least 1.5x its earlier duration.
        base = search.trial(
            TuneSettings(), "baseline", tag=f"confirm-baseline-{i + 1}", limit_s=budget.baseline_limit()
        )
        limit = max(1.5 * best.wall_s, min(budget.share(settings), budget.remaining()))
        cand = search.trial(settings, "confirm", tag=f"confirm-{i + 1}", limit_s=limit)
        ran += 2
        if not cand.ok and cand.steady_note and budget.remaining() >= best.wall_s:
            # dynamo compiled during the timed steps: that run is not steady state, never averaged in;
            # run it once more (the compile is then warm in the shared cache)
            search.plan(1, f"confirmation run {i + 1} of {best.label} compiled during timing: re-run once")
            result.notes.append(f"confirmation run {i + 1} of {best.label} re-run: {cand.cause}")
            cand = search.trial(settings, "confirm", tag=f"confirm-{i + 1}-rerun", limit_s=limit)
            ran += 1
        if not (base.ok and cand.ok):
            result.notes.append(f"confirmation run failed: {base.cause or cand.cause}")
            drop(f"a confirmation run of {best.label} failed")
            break
        search.baseline_medians.append(base.median_ms or 0.0)
        pairs.append((base.median_ms or 0.0, cand.median_ms or 0.0))
        last_pair = (base.wall_s, cand.wall_s)
        if base.startup_ms is not None and cand.startup_ms is not None:
            startups.append((base.startup_ms, cand.startup_ms))
        if (cand.compile or {}).get("compile_ms"):
            compile_ms.append(float(cand.compile["compile_ms"]))
        gate = numerics_gate(
            result.baseline.losses, cand.losses, numerics_class(settings), noise=search.determinism
        )
        if not gate.passed:
            best.verdict = Verdict.NUMERICS
            best.note = f"confirmation run failed the gate: {gate.reason}"
            result.notes.append(f"{best.label} not recommended: {best.note}")
            drop(f"{best.label} failed the numerics gate in confirmation")
            return False
        ratio = pairs[-1][0] / pairs[-1][1] if pairs[-1][1] else 0.0
        if ratio < 1.0 + MIN_MARGIN:
            if screened is not None and ratio < screened / OUTLIER and not outliers and i + 1 < total:
                # one pair against a screening 2x higher is as likely the machine as the knob: one more
                # pair decides, so the row does not show a verdict from one bad pair
                outliers += 1
                result.notes.append(
                    f"pair {i + 1} of {best.label} gave {ratio:.2f}x against {screened:.2f}x screened: "
                    "one more pair decides"
                )
                continue
            drop(f"pair {i + 1} already rules {best.label} out")
            break  # this pair already rules it out (every pair must show it faster)
    result.noise = noise_fraction(search.baseline_medians)
    result.required = required_speedup(result.noise)
    best.confirm_pairs = [[round(b, 3), round(c, 3)] for b, c in pairs]
    best.confirm_ratios = [round(b / c, 3) for b, c in pairs if b and c]
    if startups and best.startup_ms is not None:
        # the screening run's one-time cost: the first compile, on a cold inductor cache unless an
        # earlier run on this machine filled it (torchscalpel.tune.payback says both)
        best.compile = {**(best.compile or {}), "first_startup_ms": round(best.startup_ms, 1)}
    if startups:  # the one-time cost in the confirmation runs (torchscalpel.tune.payback)
        best.startup_ms = round(statistics.median(c for _, c in startups), 1)
        best.baseline_startup_ms = round(statistics.median(b for b, _ in startups), 1)
    if compile_ms:
        best.compile = {**(best.compile or {}), "confirm_compile_ms": round(statistics.median(compile_ms), 1)}
    measured = stamp(best)  # the one speedup every output shows (torchscalpel.tune.speedup)
    worst = measured.low if measured.low is not None else measured.ratio
    if (
        measured.confirmed
        and not short
        and measured.ratio is not None
        and worst is not None
        and measured.ratio >= result.required
        and worst >= 1.0 + MIN_MARGIN
    ):
        best.verdict = Verdict.WINNER
        result.winner = best
        result.confirmed_speedup = measured.ratio
        return True
    shown = ", ".join(f"{r:.2f}x" for r in best.confirm_ratios) or "no measurement"
    best.verdict = Verdict.NOT_CONFIRMED
    best.note = (
        f"interleaved pairs gave {shown} (speedup {measured.text()}); needed {result.required:.2f}x "
        f"and every pair above {1 + MIN_MARGIN:.2f}x"
        + (f" in all {total} pairs (the budget bought {len(pairs)})" if short else "")
    )
    result.notes.append(f"{best.label} not recommended: {best.note}")
    return False

"""The one-line verdict: how much slower or faster, where the time went, and what differs.

``B is 1.31x slower per step, all of it in backward; torch 2.12 -> 2.13 is the only environment change``
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torchscalpel.compare.differences import Difference
from torchscalpel.compare.facts import LossMatch, RunFacts

MIN_EFFECT = 0.05
"""A step-time change smaller than this fraction is never called a change, whatever the noise says."""
NOISE_FACTOR = 2.0
"""A change must exceed this many standard errors of the difference of the two medians."""
ALL_OF_IT = 0.8
"""A phase holding at least this share of the change is where "all of it" went."""
OFFSET_SHARE = 0.25
"""Phases moving against the net change by more than this share of it are named with their signs."""
VERDICT_ORDER = ("tune", "config", "seeds", "data", "environment", "code")
"""What the verdict names first: what the user chose (settings, arguments, seeds) before what came along."""
MAX_NAMED = 3
"""Differences named in the verdict before "and N more"."""


def median_error(facts: RunFacts) -> float:
    """Relative standard error of a run's median step time, from its spread and step count.

    The median's standard error is about 1.253 sigma / sqrt(n), and sigma about 1.4826 MAD for
    normal-ish noise; a single step (no spread known) counts as a 10% error.
    """
    if facts.noise is None or facts.steps < 2:
        return 0.10
    return 1.253 * 1.4826 * facts.noise / math.sqrt(facts.steps)


def step_change(a: RunFacts, b: RunFacts) -> tuple[float | None, bool, float]:
    """(B / A median step ratio, whether it is beyond noise, the threshold used as a fraction)."""
    if not a.median_step_ms or not b.median_step_ms:
        return None, False, MIN_EFFECT
    ratio = b.median_step_ms / a.median_step_ms
    se = math.hypot(median_error(a), median_error(b))
    threshold = max(MIN_EFFECT, NOISE_FACTOR * se)
    return ratio, abs(ratio - 1.0) > threshold, threshold


def where(a: RunFacts, b: RunFacts) -> str:
    """The phase(s) the step-time change lies in: ``all of it in backward`` / ``mostly in ...``."""
    if not a.phase_median_ms or not b.phase_median_ms:
        return ""
    # the phases' medians, the figures the step table prints (a mean would carry one outlier step into the verdict)
    deltas = {p: b.phase_median_ms.get(p, 0.0) - a.phase_median_ms.get(p, 0.0) for p in a.phase_median_ms}
    total = sum(deltas.values())
    if not total:
        return ""
    same_sign = {p: d for p, d in deltas.items() if d * total > 0}
    offsetting = sum(abs(d) for d in deltas.values() if d * total < 0)
    if offsetting > OFFSET_SHARE * abs(total):
        # Phases moved both ways (bf16: forward faster, backward slower): name the big movers, not a share.
        movers = sorted(
            (kv for kv in deltas.items() if abs(kv[1]) >= 0.1 * abs(total)), key=lambda kv: -abs(kv[1])
        )
        return "net of " + ", ".join(f"{p} {d:+.1f} ms" for p, d in movers[:3])
    ranked = sorted(same_sign.items(), key=lambda kv: -abs(kv[1]))
    if not ranked:
        return ""
    top, top_delta = ranked[0]
    share = top_delta / total
    if share >= ALL_OF_IT:
        return f"all of it in {top}"
    if len(ranked) > 1:
        second, second_delta = ranked[1]
        return f"mostly in {top} ({share:.0%}) and {second} ({second_delta / total:.0%})"
    return f"mostly in {top} ({share:.0%})"


def differences_phrase(all_diffs: Sequence[Difference]) -> str:
    """``torch 2.12 -> 2.13 is the only environment change`` / ``tune.amp (none) -> bf16 is the only
    recorded difference`` / ``differences: a; b; c and 2 more`` / ``no recorded difference``.

    Only differences that touched what ran are named as causes; a git commit that changed no file the runs
    executed is said to be that, after them."""
    diffs = [d for d in all_diffs if d.ran]
    idle = [d for d in all_diffs if not d.ran]
    aside = (
        f" ({'; '.join(d.phrase() for d in idle)} changed no file the runs executed: the script's and its "
        "modules' hashes are equal)"
        if idle
        else ""
    )
    if not diffs:
        if idle:
            return "no recorded difference in what ran" + aside
        return "no recorded difference in config, tune settings, code, data, seeds or environment"
    return _named(diffs) + aside


def _named(diffs: Sequence[Difference]) -> str:
    if len(diffs) == 1:
        d = diffs[0]
        what = "environment change" if d.kind == "environment" else "recorded difference"
        return f"{d.phrase()} is the only {what}"
    kinds = {d.kind for d in diffs}
    head = "environment changes: " if kinds == {"environment"} else f"{len(diffs)} recorded differences: "
    diffs = sorted(
        diffs, key=lambda d: VERDICT_ORDER.index(d.kind) if d.kind in VERDICT_ORDER else len(VERDICT_ORDER)
    )
    named = "; ".join(d.phrase() for d in diffs[:MAX_NAMED])
    more = f" and {len(diffs) - MAX_NAMED} more" if len(diffs) > MAX_NAMED else ""
    return head + named + more


def loss_phrase(match: LossMatch) -> str:
    """``losses bit-identical over 12 steps`` / ``losses first differ at step 0``."""
    if not match.compared:
        return ""
    if match.identical:
        return f"losses bit-identical over {match.compared} steps"
    return f"losses first differ at step {match.first_diff_step} (max |diff| {match.max_abs_diff:.3g})"


NOISY = 0.10
"""A run whose steps vary more than this (the median absolute deviation over the median) is named in the
verdict: a ±33% run moved a 1.10x verdict's figure without the page saying so."""


def noise_phrase(pairs: Sequence[tuple[str, RunFacts]]) -> str:
    """``noisy: A's steps vary ±33% ...`` for the runs above :data:`NOISY`, or ``""``."""
    noisy = [
        f"{label}'s steps vary ±{f.noise:.0%}"
        for label, f in pairs
        if f.noise is not None and f.noise > NOISY
    ]
    if not noisy:
        return ""
    return f"noisy: {', '.join(noisy)}; re-measure on an idle machine or with more steps before quoting the figure"


def load_phrase(pairs: Sequence[tuple[str, RunFacts]]) -> str:
    """``machine load: A ran at load 6.2 on 2 cores (busy), B at 0.9 on 2; ...`` when either run was measured
    on a busy machine (``scalpel env``'s rule), or ``""``."""
    if not any(f.busy for _, f in pairs):
        return ""
    runs = ", ".join(
        f"{label} ran at load {f.load:.1f} on {f.cores} cores{' (busy)' if f.busy else ''}"
        for label, f in pairs
        if f.load is not None and f.cores is not None
    )
    return (
        f"machine load: {runs}; other processes slow and spread step times, so load may explain the difference: "
        "re-measure both at the same, low load"
    )


def speed_phrase(label: str, base_label: str, a: RunFacts, b: RunFacts) -> str:
    """Which run is slower and by how much, beyond noise or within it: ``B is 1.31x slower per step, all of it
    in backward`` / ``B is 1.23x slower per step than A, within noise (threshold ±63%)``."""
    ratio, significant, threshold = step_change(a, b)
    if ratio is None:
        return f"{label} has no step time to compare"
    direction = "slower" if ratio > 1 else "faster"
    factor = ratio if ratio > 1 else 1 / ratio
    if significant:
        speed = f"{label} is {factor:.2f}x {direction} per step"
        place = where(a, b)
        return f"{speed}, {place}" if place else speed
    if f"{factor:.2f}" == "1.00":
        return f"{label}'s step time equals {base_label}'s (1.00x), within noise (threshold ±{threshold:.0%})"
    return f"{label} is {factor:.2f}x {direction} per step than {base_label}, within noise (threshold ±{threshold:.0%})"


def verdict(
    label: str,
    a: RunFacts,
    b: RunFacts,
    match: LossMatch,
    diffs: Sequence[Difference],
    *,
    base_label: str = "A",
) -> str:
    """One line naming which run is slower and by how much (beyond noise or within it), where it went, the
    machine load when either run was busy, the runs' noise when it is large, the losses and what differs."""
    parts = [speed_phrase(label, base_label, a, b)]
    load = load_phrase([(base_label, a), (label, b)])
    if load:
        parts.append(load)
    noise = noise_phrase([(base_label, a), (label, b)])
    if noise:
        parts.append(noise)
    losses = loss_phrase(match)
    if losses:
        parts.append(losses)
    parts.append(differences_phrase(diffs))
    return "; ".join(parts)

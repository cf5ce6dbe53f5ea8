"""Which screened trials go on: the winners to combine, the near-ties worth stacking on the best,
and the order in which candidates are confirmed."""

from __future__ import annotations

from torchscalpel.tune.runner import TrialResult
from torchscalpel.tune.states import Verdict

MAX_TIES = 2
"""Near-ties stacked onto the best configuration, at most (each costs one trial)."""

TIE_FAMILIES = ("optimizer", "dataloader", "matmul", "cudnn", "channels_last", "threads")
"""Families whose knob is cheap and cannot slow a step down much when it does not help, so a
screening tie is worth one trial on top of the best: a fused optimizer saves ~4 ms of a 140 ms
step, below the screening margin on its own but real once the step is bf16."""


def winners(singles: list[TrialResult]) -> list[TrialResult]:
    """The best ``faster`` trial of each knob family, best first.

    Ranked by the ratio against the baseline beside each trial, not by raw step time: trials
    screened minutes apart on a shared machine ran at different loads (seen on char_transformer:
    a 1.06x DataLoader trial at 295.7 ms was confirmed before a 1.10x bf16 trial at 295.8 ms).
    """
    best: dict[str, TrialResult] = {}
    for trial in singles:
        # a winner confirmed before the long tail was screened is still the base of the combinations
        if trial.verdict not in (Verdict.FASTER, Verdict.WINNER):
            continue
        current = best.get(trial.family)
        if current is None or _rank(trial) < _rank(current):
            best[trial.family] = trial
    return sorted(best.values(), key=_rank)


def _rank(trial: TrialResult) -> tuple[float, float]:
    return (-(trial.speedup or 0.0), trial.median_ms or 0.0)


def near_ties(singles: list[TrialResult], chosen: list[TrialResult]) -> list[TrialResult]:
    """Trials that passed the numerics gate and were not slower than the baseline beside them
    (ratio >= 1.0) but missed the margin, one per cheap family not already ``chosen``, best ratio
    first: candidates to stack on the best configuration."""
    taken = {t.family for t in chosen}
    best: dict[str, TrialResult] = {}
    for trial in singles:
        if (
            trial.verdict != Verdict.NOT_FASTER
            or trial.family not in TIE_FAMILIES
            or trial.family in taken
            or trial.speedup is None
            or trial.speedup < 1.0
        ):
            continue
        current = best.get(trial.family)
        if current is None or trial.speedup > (current.speedup or 0.0):
            best[trial.family] = trial
    return sorted(best.values(), key=lambda t: -(t.speedup or 0.0))[:MAX_TIES]


def confirm_queue(
    best: TrialResult | None, chosen: list[TrialResult], singles: list[TrialResult]
) -> list[TrialResult]:
    """Candidates to confirm in order: the best combination, then the single winners, then every
    other ``faster`` single trial by its ratio; each label once."""
    faster = sorted((t for t in singles if t.verdict == Verdict.FASTER), key=_rank)
    queue: list[TrialResult] = []
    for candidate in (t for t in [best, *chosen, *faster] if t is not None):
        if all(candidate.label != q.label for q in queue):
            queue.append(candidate)
    return queue

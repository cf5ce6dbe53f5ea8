"""The search's clock: what is left, each trial's time limit, and what confirming a candidate costs.

No time is held in reserve: a trial gets a few baseline durations (plus a cold compile) within
what is left, and only a candidate that has won screening has its confirmation's measured cost
(``pairs x (baseline + candidate)``) kept back. When too little is left, :meth:`Budget.advice`
says what the pairs need and which ``--budget`` would have done it.
"""

from __future__ import annotations

import math
import time

from torchscalpel.tune.runner import TrialResult
from torchscalpel.tune.settings import TuneSettings

MAX_AUTOTUNE_MIN_S = 300.0
"""A max-autotune trial runs only with this much budget left (it benchmarks every kernel choice)."""

COMPILE_MIN_S = 30.0
"""Seconds a compile trial needs on top of a baseline run before it is started: a cold inductor
compile of a model region is 15-25 s per graph on these CPUs (TORCH-FACTS.md). Started with less, it
times out half-way and spends what the cheaper knobs after it needed (seen on pytorch/examples mnist,
``--budget 3m``: compile(conv2) ran on the 26 s left beside the confirmation's reserve, timed out, and
channels_last, threads, dataloader and optimizer were then not run)."""

NEED_FACTOR = 1.2
"""A trial is started only with at least this many baseline runs' time left (plus a compile's)."""


class Budget:
    """Wall-clock budget of one search, started when it is made."""

    def __init__(self, budget_s: float, confirm_pairs: int) -> None:
        self.budget_s = budget_s
        self.confirm_pairs = confirm_pairs
        self.start = time.monotonic()
        self.deadline = self.start + budget_s
        self.baseline_wall = 0.0
        """Wall time of one plain baseline run (set by the search once it is measured)."""

    def remaining(self) -> float:
        """Seconds left in the budget."""
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        """Seconds spent since the search started."""
        return time.monotonic() - self.start

    def share(self, settings: TuneSettings) -> float:
        """A trial's time limit: a few baseline durations (plus a cold compile), within what is left."""
        share = max(3.0 * self.baseline_wall, 30.0)
        if settings.compile is not None:
            share += 90.0  # a cold inductor compile of a model region is 15-25 s per graph here
            if settings.compile.mode.startswith("max-autotune"):
                share += 180.0  # autotuning benchmarks every GEMM / conv choice
        return min(share, self.remaining())

    def baseline_limit(self) -> float:
        """Time limit of a baseline re-measure: at least 1.5x a baseline run, even past the budget
        (killing it half-way would waste what it already spent)."""
        return max(1.5 * self.baseline_wall, min(3 * self.baseline_wall, self.remaining()))

    def pair_s(self, candidate: TrialResult) -> float:
        """Seconds one interleaved confirmation pair of ``candidate`` takes (from measured runs)."""
        return self.baseline_wall + max(candidate.wall_s, self.baseline_wall)

    def confirm_s(self, candidate: TrialResult) -> float:
        """Seconds all confirmation pairs of ``candidate`` take."""
        return self.confirm_pairs * self.pair_s(candidate)

    def advice(
        self,
        candidate: TrialResult,
        pairs: int | None = None,
        *,
        noise: float | None = None,
        measured: tuple[float, float] | None = None,
    ) -> str:
        """Why ``candidate`` cannot be confirmed in what is left (``pairs`` still to run, default all),
        and the budget that would have done it; ``noise`` (between consecutive baselines) says what
        each pair has to show at that noise."""
        pairs = self.confirm_pairs if pairs is None else pairs
        # a pair already run says what a pair takes (its compile warm, not the screening's cold one)
        base_s, cand_s = measured or (self.baseline_wall, max(candidate.wall_s, self.baseline_wall))
        need = pairs * (base_s + cand_s)
        left = max(0.0, self.remaining())
        # What was spent so far plus the pairs, rounded up to half a minute.
        suggest = 30 * math.ceil((self.elapsed() + need) / 30)
        return (
            f"{'the remaining ' if pairs < self.confirm_pairs else ''}{pairs} confirmation "
            f"pair(s) need about {need:.0f} s "
            f"(baseline {base_s:.0f} s + candidate {cand_s:.0f} s "
            f"each) and {left:.0f} s of the {self.budget_s:.0f} s budget were left; "
            f"--budget {suggest:.0f}s would confirm it"
            + (
                f" (at this noise, {noise:.0%} between consecutive baselines, the median pair must "
                f"show {1 + max(0.03, noise):.2f}x and every pair 1.03x)"
                if noise
                else ""
            )
        )

    def need_s(self, settings: TuneSettings) -> float:
        """Seconds a trial of ``settings`` needs to finish: a baseline run with some margin, plus a cold
        compile for a compile trial (:data:`COMPILE_MIN_S`)."""
        need = NEED_FACTOR * self.baseline_wall
        if settings.compile is not None:
            need += COMPILE_MIN_S
        return need

    def cannot_run(self, settings: TuneSettings, keep: float, refresh_s: float) -> str:
        """Why a planned trial is not run now (empty: run it), keeping ``keep`` seconds for the
        confirmations of candidates that won and ``refresh_s`` for the baseline re-measure due
        before it: a refresh that leaves the trial no time would only waste the budget, and so would
        a trial started with less than it needs (:meth:`need_s`), which times out half-way."""
        left = self.remaining() - keep - refresh_s
        what = " (the rest is kept to confirm the candidates that won)" if keep else ""
        if left < NEED_FACTOR * self.baseline_wall:
            return f"the budget ran out before this trial: {max(0.0, left):.0f} s left{what}"
        need = self.need_s(settings)
        if left < need:
            return (
                f"a compile trial needs about {need:.0f} s (a baseline run and a cold compile) and "
                f"{left:.0f} s were left{what}; cheaper knobs went on"
            )
        spec = settings.compile
        if spec is not None and spec.mode.startswith("max-autotune") and left < MAX_AUTOTUNE_MIN_S:
            return (
                f"max-autotune benchmarks every kernel choice while compiling; it is tried with at least "
                f"{MAX_AUTOTUNE_MIN_S:.0f} s left ({left:.0f} s were)"
            )
        return ""

    def suggest_s(self, unrun: list[TuneSettings]) -> int:
        """A ``--budget`` (seconds, rounded up to half a minute) that would have run ``unrun`` too and
        confirmed one winner: what was spent, their needs, and the confirmation pairs."""
        need = (
            self.elapsed() + sum(self.need_s(s) for s in unrun) + self.confirm_pairs * 2 * self.baseline_wall
        )
        return int(30 * math.ceil(need / 30))

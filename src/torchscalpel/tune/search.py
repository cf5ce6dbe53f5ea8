"""The tune search: baseline, single knobs, greedy combination, interleaved confirmation.

1. Baseline twice: once with model facts, submodule timings and a two-step profile (what can
   apply, which region is hottest, what bounds the step), once plain (the reference step time).
   Their losses must agree: that is the script's own nondeterminism, the floor of the numerics gate.
2. Every applicable single knob, in the order the baseline's bottleneck class gives
   (:mod:`torchscalpel.tune.plan`), each row saying why. A knob that cannot apply is skipped with
   the reason; a trial that crashes, runs out of memory, fails to compile or overruns its share of
   the budget is reported with the cause and the search goes on. No time is held back until a
   candidate has won: then exactly its confirmation's (measured) time is kept.
3. Winners (faster by a margin, numerics gate passed), best per family, combined greedily: a knob
   joins the combination only if the combination gets faster again and still passes the gate.
4. Confirmation: the best configuration and the baseline run alternately; the recommended
   configuration must beat the baseline in those interleaved pairs by more than the noise seen
   between the baseline repeats. Otherwise nothing is recommended: the baseline stays.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.runtime.target import Target
from torchscalpel.runtime.window import check_window
from torchscalpel.tune.apply import code_lines, knob_families, numerics_class
from torchscalpel.tune.bottleneck import Bottleneck, classify_trial
from torchscalpel.tune.facts import ModelFacts
from torchscalpel.tune.knobs import KNOB_NAMES, Knob, all_knobs
from torchscalpel.tune.plan import Candidate, plan_candidates
from torchscalpel.tune.runner import TrialResult, profile_steps_for, run_trial
from torchscalpel.tune.settings import TuneSettings
from torchscalpel.tune.states import TrialStatus, Verdict
from torchscalpel.tune.verify import (
    MIN_MARGIN,
    loss_deviation,
    noise_fraction,
    numerics_gate,
    paired_speedup,
    required_speedup,
    speedup,
)

REFRESH_EVERY = 2
"""Screening trials between two baseline runs."""

MAX_AUTOTUNE_MIN_S = 300.0
"""A max-autotune trial runs only with this much budget left (it benchmarks every kernel choice)."""

MEMORY_NOTE = 1.25
"""A candidate whose peak memory exceeds the baseline's by this factor gets a note in the table."""


@dataclass(kw_only=True, slots=True)
class TuneOptions:
    """How long and how hard to search."""

    out_dir: Path
    """Folder for trial runs (one sub-folder each), the record and the report."""
    budget_s: float = 600.0
    """Wall-clock budget for the whole search, baseline included."""
    warmup: int = 3
    """Steps excluded from timing (compilation happens here)."""
    steps: int = 10
    """Measured steps per trial."""
    seed: int = 0
    """torch.manual_seed before the script, the same for every trial."""
    knobs: tuple[str, ...] = KNOB_NAMES
    """Knob families to try."""
    compile_backend: str = "inductor"
    compile_modes: tuple[str, ...] = ("default",)
    confirm_pairs: int = 3
    """Interleaved baseline/candidate pairs for the final check."""
    step_kind: str = "auto"
    """What ends a step in every trial (``--step-kind``)."""
    cache_dir: Path | None = None
    """TORCHINDUCTOR_CACHE_DIR for the trials (default: the environment's, else inductor's per-user cache)."""

    def __post_init__(self) -> None:
        if self.budget_s <= 0:
            raise ValueError("--budget must be positive")
        if self.steps < 2:
            raise ValueError("--steps must be at least 2, so a median step time exists")
        check_window(warmup=self.warmup, steps=self.steps, step_kind=self.step_kind)
        unknown = [k for k in self.knobs if k not in KNOB_NAMES]
        if unknown:
            raise ValueError(f"unknown knob(s) {', '.join(unknown)}; choose from {', '.join(KNOB_NAMES)}")


class Progress(Protocol):
    """What the search reports while it runs (the CLI draws it with rich)."""

    def message(self, text: str) -> None: ...

    def trial_started(self, label: str, limit_s: float, *, index: int = 0, total: int = 0,
                      left_s: float = 0.0) -> None:
        """Trial ``index`` of ``total`` (the plan as it stands; it shrinks when the budget runs out
        or a stage ends early) starts, with ``left_s`` seconds of the budget left."""

    def trial_finished(self, result: TrialResult) -> None: ...


class SilentProgress:
    """A :class:`Progress` that shows nothing."""

    def message(self, text: str) -> None:
        return None

    def trial_started(self, label: str, limit_s: float, *, index: int = 0, total: int = 0,
                      left_s: float = 0.0) -> None:
        return None

    def trial_finished(self, result: TrialResult) -> None:
        return None


@dataclass(kw_only=True, slots=True)
class TuneResult:
    """Everything the search found, ready for the table, the report and scalpel.toml."""

    baseline: TrialResult
    trials: list[TrialResult] = field(default_factory=list)
    """Every candidate (single knobs, combinations), skipped ones included, in the order run."""
    winner: TrialResult | None = None
    """The confirmed configuration, or None when nothing beat the baseline reliably."""
    confirmed_speedup: float | None = None
    """Median baseline/winner ratio over the interleaved confirmation pairs."""
    required: float = 1.0 + MIN_MARGIN
    noise: float = 0.0
    """Relative spread of the baseline's repeated median step times."""
    determinism: float | None = None
    """Loss deviation between two baseline runs with the same seed."""
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    interrupted: bool = False
    """Ctrl-C ended the search early."""
    baseline_refs: list[float] = field(default_factory=list)
    """Median step times of the baseline re-measured between screening trials."""

    @property
    def settings(self) -> TuneSettings:
        """The recommended settings (empty: keep the script as it is)."""
        return TuneSettings.from_dict(self.winner.settings) if self.winner else TuneSettings()

    def ranked(self) -> list[TrialResult]:
        """Baseline and trials, fastest measured first; unmeasured ones last."""
        rows = [self.baseline, *self.trials]
        return sorted(rows, key=lambda r: (r.median_ms is None, r.median_ms or 0.0))

    def to_dict(self) -> dict[str, Any]:
        """JSON form, stored as ``record.sections["tune"]``."""
        return {
            "baseline": self.baseline.to_dict(),
            "trials": [t.to_dict() for t in self.trials],
            "winner": self.winner.to_dict() if self.winner else None,
            "settings": self.settings.to_dict(),
            "code_lines": code_lines(self.settings),
            "confirmed_speedup": self.confirmed_speedup,
            "required_speedup": self.required,
            "noise": self.noise,
            "determinism": self.determinism,
            "facts": self.facts,
            "notes": list(self.notes),
            "elapsed_s": self.elapsed_s,
            "interrupted": self.interrupted,
            "baseline_refs": list(self.baseline_refs),
        }


class Search:
    """One tune search over one target (see the module docstring for the steps)."""

    def __init__(self, target: Target, options: TuneOptions, progress: Progress | None = None) -> None:
        self.target = target
        self.options = options
        self.progress = progress or SilentProgress()
        self.start = time.monotonic()
        self.deadline = self.start + options.budget_s
        # None keeps inductor's own per-user cache (or the user's TORCHINDUCTOR_CACHE_DIR), shared
        # by every trial and every tune run: a warm compile costs ~2 s instead of 15-25 s.
        self.cache_dir = options.cache_dir
        self._n = 0
        self._planned = 2
        """Trial runs planned so far (the "M" of "trial N of M"); stages add and drop runs."""
        self.baseline_wall = 0.0
        self.baseline_medians: list[float] = []
        self._determinism = 0.0
        self._ref_ms = 0.0
        self._since_ref = 0

    # -- helpers ----------------------------------------------------------------------------------
    def remaining(self) -> float:
        """Seconds left in the budget."""
        return self.deadline - time.monotonic()

    def _share(self, settings: TuneSettings) -> float:
        """A trial's time limit: a few baseline durations (plus a cold compile), within what is left."""
        share = max(3.0 * self.baseline_wall, 30.0)
        if settings.compile is not None:
            share += 90.0  # a cold inductor compile of a model region is 15-25 s per graph here
            if settings.compile.mode.startswith("max-autotune"):
                share += 180.0  # autotuning benchmarks every GEMM / conv choice
        return min(share, self.remaining())

    def _plan(self, delta: int) -> None:
        """Add (or, negative, drop) runs from the plan shown as "trial N of M"."""
        self._planned = max(self._n, self._planned + delta)

    def _run(self, settings: TuneSettings, family: str, *, limit_s: float, facts: bool = False,
             module_times: bool = False, tag: str = "", profile_steps: int = 0) -> TrialResult:
        self._n += 1
        self._planned = max(self._planned, self._n)
        name = f"{self._n:02d}-{tag or family}"
        self.progress.trial_started(settings.label(), limit_s, index=self._n, total=self._planned,
                                    left_s=max(0.0, self.remaining()))
        kwargs: dict[str, Any] = {}
        if profile_steps:
            kwargs["profile_steps"] = profile_steps
        result = run_trial(self.target, settings, self.options.out_dir / "trials" / name,
                           warmup=self.options.warmup, steps=self.options.steps, seed=self.options.seed,
                           timeout_s=limit_s, family=family, facts=facts, module_times=module_times,
                           cache_dir=self.cache_dir, step_kind=self.options.step_kind, **kwargs)
        self.progress.trial_finished(result)
        return result

    # -- the search -------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        """Run the whole search within the budget and return what it found.

        Ctrl-C after the baseline ends the search early but still returns what was measured
        (``interrupted`` is set), so the caller can save it; a winner is only kept if confirmed.
        """
        base = self._baseline()
        result = TuneResult(baseline=base, facts=base.facts)
        try:
            self._search(result)
        except KeyboardInterrupt:
            result.interrupted = True
            result.notes.append("interrupted (Ctrl-C): the search stopped early; what was measured is kept")
        result.elapsed_s = time.monotonic() - self.start
        return result

    def _search(self, result: TuneResult) -> None:
        facts = ModelFacts.from_dict(result.baseline.facts)
        knobs = [k for k in all_knobs(compile_backend=self.options.compile_backend,
                                      compile_modes=self.options.compile_modes) if k.name in self.options.knobs]
        singles = self._singles(knobs, facts, result)
        winners = self._winners(singles, result)
        if not winners:
            result.notes.append("no single knob was faster than the baseline by the margin with numerics intact")
        best = self._combine(winners, result)
        # Confirm the best; if it does not hold up, the next single winners while time allows.
        faster = sorted((t for t in singles if t.verdict == Verdict.FASTER), key=lambda t: t.median_ms or 0.0)
        queue: list[TrialResult] = []
        for candidate in (t for t in [best, *winners, *faster] if t is not None):
            if all(candidate.label != q.label for q in queue):
                queue.append(candidate)
        for candidate in queue:
            if self._confirm(candidate, result):
                break
            if self.remaining() < self._pair_s(candidate):
                left = queue[queue.index(candidate) + 1:]
                if left:
                    result.notes.append(f"{', '.join(t.label for t in left)} not confirmed: "
                                        f"{self._budget_advice(left[0])}")
                break

    def _pair_s(self, candidate: TrialResult) -> float:
        """Seconds one interleaved confirmation pair of ``candidate`` takes (from measured runs)."""
        return self.baseline_wall + max(candidate.wall_s, self.baseline_wall)

    def _budget_advice(self, candidate: TrialResult, pairs: int | None = None) -> str:
        """Why ``candidate`` cannot be confirmed in what is left (``pairs`` still to run, default all),
        and the budget that would have done it."""
        pairs = self.options.confirm_pairs if pairs is None else pairs
        need = pairs * self._pair_s(candidate)
        left = max(0.0, self.remaining())
        # What was spent so far plus the pairs, rounded up to half a minute.
        suggest = 30 * math.ceil((time.monotonic() - self.start + need) / 30)
        return (f"{'the remaining ' if pairs < self.options.confirm_pairs else ''}{pairs} confirmation "
                f"pair(s) need about {need:.0f} s "
                f"(baseline {self.baseline_wall:.0f} s + candidate {max(candidate.wall_s, self.baseline_wall):.0f} s "
                f"each) and {left:.0f} s of the {self.options.budget_s:.0f} s budget were left; "
                f"--budget {suggest:.0f}s would confirm it")

    def _baseline(self) -> TrialResult:
        self.progress.message("baseline: the script as it is (with model facts and a short profile), "
                              "then once plain for timing")
        budget = self.options.budget_s
        first = self._run(TuneSettings(), "baseline", limit_s=min(budget * 0.4, self.remaining()),
                          facts=True, module_times=True, tag="baseline-facts",
                          profile_steps=profile_steps_for(self.options.steps))
        if not first.ok:
            raise ScalpelError(
                f"The baseline run failed ({first.cause}); fix the script or its arguments first "
                f"(output in {first.out_dir}).")
        self.baseline_wall = first.wall_s
        plain = self._run(TuneSettings(), "baseline", limit_s=min(max(3 * first.wall_s, 30.0), self.remaining()),
                          tag="baseline")
        if not plain.ok:
            raise ScalpelError(f"The second baseline run failed ({plain.cause}); the script is not repeatable "
                               f"(output in {plain.out_dir}).")
        plain.facts = dict(first.facts)
        plain.facts["bottleneck"] = classify_trial(first).to_dict()
        plain.verdict = Verdict.BASELINE
        plain.baseline_ms = plain.median_ms
        self.baseline_medians.append(plain.median_ms or 0.0)
        self._ref_ms = plain.median_ms or 0.0
        # The plain run sets the pace: the facts run also profiles and times every submodule.
        self.baseline_wall = plain.wall_s
        dev, _ = loss_deviation(first.losses, plain.losses)
        self._determinism = dev or 0.0
        return plain

    def _singles(self, knobs: list[Knob], facts: ModelFacts, result: TuneResult) -> list[TrialResult]:
        result.determinism = self._determinism
        planned, skipped = plan_candidates(knobs, facts)
        result.trials.extend(skipped)
        bottleneck = Bottleneck.from_dict(facts.bottleneck)
        self.progress.message(f"profile: {bottleneck.summary()}")
        self.progress.message(f"{len(planned)} single-knob trial(s) planned, in the order the profile suggests")
        self._plan(len(planned) + len(planned) // (REFRESH_EVERY + 1) + 2 * self.options.confirm_pairs)
        measured: list[TrialResult] = []
        for cand in planned:
            settings = cand.settings
            # No reserve for confirmations that may never run: only once a candidate has won
            # screening is the time its confirmation needs kept back (measured, not guessed).
            keep = max((self.options.confirm_pairs * self._pair_s(t) for t in measured
                        if t.verdict == Verdict.FASTER), default=0.0)
            why_not = self._cannot_run(cand, keep)
            if why_not:
                result.trials.append(TrialResult(label=settings.label(), settings=settings.to_dict(),
                                                 family=cand.knob.name, status=TrialStatus.NOT_RUN,
                                                 verdict=Verdict.NOT_RUN, cause=why_not, reason=cand.reason,
                                                 reason_short=cand.short))
                self._plan(-1)
                continue
            self._refresh_baseline(result)
            trial = self._run(settings, cand.knob.name, limit_s=min(self._share(settings), self.remaining() - keep))
            trial.reason, trial.reason_short = cand.reason, cand.short
            self._since_ref += 1
            self._judge(trial, result)
            result.trials.append(trial)
            measured.append(trial)
        return measured

    def _refresh_due(self) -> bool:
        """True when the next trial is preceded by a baseline re-measure."""
        return self._since_ref >= REFRESH_EVERY and self.remaining() >= 3 * self.baseline_wall

    def _cannot_run(self, cand: Candidate, keep: float) -> str:
        """Why a planned trial is not run now (empty: run it). The baseline re-measure due before
        it counts too: a refresh that leaves the trial no time would only waste the budget."""
        left = self.remaining() - keep - (self.baseline_wall if self._refresh_due() else 0.0)
        if left < self.baseline_wall * 1.2:
            what = " (the rest is kept to confirm the candidates that won)" if keep else ""
            return f"the budget ran out before this trial: {max(0.0, left):.0f} s left{what}"
        spec = cand.settings.compile
        if spec is not None and spec.mode.startswith("max-autotune") and left < MAX_AUTOTUNE_MIN_S:
            return (f"max-autotune benchmarks every kernel choice while compiling; it is tried with at least "
                    f"{MAX_AUTOTUNE_MIN_S:.0f} s left ({left:.0f} s were)")
        return ""

    def _refresh_baseline(self, result: TuneResult) -> None:
        """Re-measure the baseline every :data:`REFRESH_EVERY` trials, so screening compares
        each candidate with a baseline measured minutes, not a quarter of an hour, earlier."""
        if not self._refresh_due():
            return
        ref = self._run(TuneSettings(), "baseline", tag="baseline-refresh",
                        limit_s=max(1.5 * self.baseline_wall, min(3 * self.baseline_wall, self.remaining())))
        self._since_ref = 0
        if ref.ok and ref.median_ms:
            self._ref_ms = ref.median_ms
            self.baseline_medians.append(ref.median_ms)
            result.baseline_refs.append(round(ref.median_ms, 3))

    def _judge(self, trial: TrialResult, result: TuneResult) -> None:
        """Set speedup, gate outcome and verdict of a measured trial against the baseline."""
        if trial.status == TrialStatus.TIMEOUT:
            trial.verdict = Verdict.TIMEOUT
            return
        if trial.status == TrialStatus.NOT_APPLIED:
            trial.verdict = Verdict.NOT_APPLIED
            return
        if not trial.ok:
            trial.verdict = Verdict.FAILED
            return
        settings = TuneSettings.from_dict(trial.settings)
        gate = numerics_gate(result.baseline.losses, trial.losses, numerics_class(settings),
                             noise=self._determinism)
        trial.deviation, trial.tolerance = gate.deviation, gate.tolerance
        # Against the most recent baseline run: load on a shared machine drifts within minutes.
        # The row keeps that baseline's median beside its ratio, so the table says which one it is.
        trial.baseline_ms = self._ref_ms or result.baseline.median_ms
        trial.speedup = speedup(trial.baseline_ms, trial.median_ms)
        base_peak = result.baseline.peak_bytes
        if trial.peak_bytes and base_peak and trial.peak_bytes > MEMORY_NOTE * base_peak:
            trial.note = f"peak memory {trial.peak_bytes / base_peak:.2f}x the baseline's"
        if not gate.passed:
            trial.verdict = Verdict.NUMERICS
            trial.note = gate.reason
        elif trial.speedup is not None and trial.speedup >= 1.0 + MIN_MARGIN:
            trial.verdict = Verdict.FASTER
        else:
            trial.verdict = Verdict.NOT_FASTER

    def _winners(self, singles: list[TrialResult], result: TuneResult) -> list[TrialResult]:
        best: dict[str, TrialResult] = {}
        for trial in singles:
            if trial.verdict != Verdict.FASTER:
                continue
            current = best.get(trial.family)
            if current is None or (trial.median_ms or 0) < (current.median_ms or 0):
                best[trial.family] = trial
        return sorted(best.values(), key=lambda t: t.median_ms or 0.0)

    def _combine(self, winners: list[TrialResult], result: TuneResult) -> TrialResult | None:
        if not winners:
            return None
        current = winners[0]
        self._plan(len(winners) - 1)
        for candidate in winners[1:]:
            # Keep what confirming the current best needs, and nothing more.
            keep = self.options.confirm_pairs * self._pair_s(current)
            merged = TuneSettings.from_dict(current.settings).merged(TuneSettings.from_dict(candidate.settings))
            refresh = self.baseline_wall if self._refresh_due() else 0.0
            if self.remaining() - keep - refresh < self.baseline_wall * 1.2:
                result.notes.append(f"not combined with {candidate.label}: the budget left "
                                    f"({max(0.0, self.remaining()):.0f} s) is what confirming {current.label} needs")
                self._plan(-1)
                continue
            self._refresh_baseline(result)
            self._since_ref += 1
            trial = self._run(merged, "combined", limit_s=min(self._share(merged), self.remaining() - keep),
                              tag="combined")
            trial.reason = f"combination of the winners {current.label} and {candidate.label}"
            trial.reason_short = "combination of winners"
            self._judge(trial, result)
            result.trials.append(trial)
            if trial.verdict == Verdict.FASTER and (trial.median_ms or 0) * (1 + MIN_MARGIN) < (current.median_ms or 0):
                current = trial
            elif trial.verdict == Verdict.FASTER:
                trial.verdict = Verdict.NOT_FASTER
                trial.note = f"adding {candidate.label} did not beat {current.label} by {MIN_MARGIN:.0%}"
        return current

    def _confirm(self, best: TrialResult, result: TuneResult) -> bool:
        """Interleave baseline and ``best``; recommend it only if it wins beyond the noise.

        Two conditions: the median of the per-pair ratios reaches ``1 + max(3 %, noise)``, and
        every single pair shows ``best`` faster by at least 3 % (one lucky pair cannot carry it).
        The time comes from what is left now; when that is too little for even one pair, the note
        says what the pairs need and which budget would have done it.
        """
        if self.remaining() < self._pair_s(best):
            best.note = best.note or "not confirmed: budget spent"
            result.notes.append(f"{best.label} not confirmed: {self._budget_advice(best)}")
            return False
        self.progress.message(f"confirming {best.label} against the baseline in interleaved pairs "
                              f"({max(0.0, self.remaining()):.0f} s left)")
        settings = TuneSettings.from_dict(best.settings)
        pairs: list[tuple[float, float]] = []
        for i in range(self.options.confirm_pairs):
            if pairs and self.remaining() < self._pair_s(best):
                result.notes.append(f"confirmation of {best.label} stopped after {len(pairs)} of "
                                    f"{self.options.confirm_pairs} pair(s): "
                                    f"{self._budget_advice(best, self.options.confirm_pairs - len(pairs))}")
                self._plan(-2 * (self.options.confirm_pairs - i))
                break
            # The confirmation may overrun the budget slightly rather than kill a run half-way:
            # each run gets at least 1.5x its earlier duration.
            base = self._run(TuneSettings(), "baseline", tag=f"confirm-baseline-{i + 1}",
                             limit_s=max(1.5 * self.baseline_wall, min(3 * self.baseline_wall, self.remaining())))
            cand = self._run(settings, "confirm", tag=f"confirm-{i + 1}",
                             limit_s=max(1.5 * best.wall_s, min(self._share(settings), self.remaining())))
            if not (base.ok and cand.ok):
                result.notes.append(f"confirmation run failed: {base.cause or cand.cause}")
                break
            self.baseline_medians.append(base.median_ms or 0.0)
            pairs.append((base.median_ms or 0.0, cand.median_ms or 0.0))
            gate = numerics_gate(result.baseline.losses, cand.losses, numerics_class(settings),
                                 noise=self._determinism)
            if not gate.passed:
                best.verdict = Verdict.NUMERICS
                best.note = f"confirmation run failed the gate: {gate.reason}"
                result.notes.append(f"{best.label} not recommended: {best.note}")
                return False
            if pairs[-1][0] < (1.0 + MIN_MARGIN) * pairs[-1][1]:
                self._plan(-2 * (self.options.confirm_pairs - i - 1))
                break  # this pair already rules it out (every pair must show it faster)
        result.noise = noise_fraction(self.baseline_medians)
        result.required = required_speedup(result.noise)
        ratios = [b / c for b, c in pairs if b and c]
        ratio = paired_speedup(pairs)
        worst = min(ratios, default=None)
        best.confirm_ratios = [round(r, 3) for r in ratios]
        best.confirm_pairs = [[round(b, 3), round(c, 3)] for b, c in pairs]
        if ratio is not None and worst is not None and ratio >= result.required and worst >= 1.0 + MIN_MARGIN:
            best.verdict = Verdict.WINNER
            result.winner = best
            result.confirmed_speedup = ratio
            return True
        shown = ", ".join(f"{r:.2f}x" for r in best.confirm_ratios) or "no measurement"
        best.verdict = Verdict.NOT_CONFIRMED
        best.note = (f"interleaved pairs gave {shown}; needed a median of {result.required:.2f}x "
                     f"and every pair above {1 + MIN_MARGIN:.2f}x")
        result.notes.append(f"{best.label} not recommended: {best.note}")
        if result.confirmed_speedup is None:
            result.confirmed_speedup = ratio
        return False


def tune(target: Target, options: TuneOptions, progress: Progress | None = None) -> TuneResult:
    """Run a tune search (see :class:`Search`)."""
    return Search(target, options, progress).run()


def parse_knobs(text: str | None) -> tuple[str, ...]:
    """``--knobs amp,compile`` -> ``("amp", "compile")``; raise UsageError naming unknown ones."""
    if not text:
        return KNOB_NAMES
    names = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in names if k not in KNOB_NAMES]
    if unknown:
        raise UsageError(f"Unknown knob {', '.join(unknown)} in --knobs; choose from {', '.join(KNOB_NAMES)}.")
    return names


__all__ = ["Progress", "Search", "TuneOptions", "TuneResult", "knob_families", "parse_knobs", "tune"]

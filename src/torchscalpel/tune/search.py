"""The tune search loop: baseline, single knobs, greedy combination, then confirmation.

1. Baseline twice: once with model facts, submodule timings and a two-step profile (what can
   apply, which region is hottest, what bounds the step), once plain (the reference step time).
   Their losses must agree: that is the script's own nondeterminism, the floor of the numerics gate.
2. Every applicable single knob, in the order the baseline's bottleneck class gives
   (:mod:`torchscalpel.tune.plan`), each row saying why. A knob that cannot apply is skipped with
   the reason; a trial that crashes, runs out of memory, fails to compile or overruns its share of
   the budget is reported with the cause and the search goes on. No time is held back until a
   candidate has won (:mod:`torchscalpel.tune.budget`).
3. Winners (faster by a margin, numerics gate passed), best per family, combined greedily
   (:mod:`torchscalpel.tune.ordering`): a knob joins the combination only if the combination gets
   faster again and still passes the gate.
4. Confirmation (:mod:`torchscalpel.tune.confirm`): the best configuration and the baseline run
   alternately; otherwise nothing is recommended and the baseline stays.
"""

from __future__ import annotations

import statistics
from typing import Any

from torchscalpel.errors import ScalpelError
from torchscalpel.runtime.target import Target
from torchscalpel.tune.apply import knob_families, numerics_class
from torchscalpel.tune.bottleneck import Bottleneck, classify_trial
from torchscalpel.tune.budget import MAX_AUTOTUNE_MIN_S, Budget
from torchscalpel.tune.confirm import confirm
from torchscalpel.tune.facts import ModelFacts
from torchscalpel.tune.knobs import Knob, all_knobs
from torchscalpel.tune.options import Progress, SilentProgress, TuneOptions, parse_knobs
from torchscalpel.tune.ordering import confirm_queue, near_ties, winners
from torchscalpel.tune.payback import payback_of, run_steps
from torchscalpel.tune.plan import plan_candidates
from torchscalpel.tune.result import TuneResult
from torchscalpel.tune.runner import TrialResult, profile_steps_for, run_trial
from torchscalpel.tune.settings import TuneSettings
from torchscalpel.tune.speedup import stamp
from torchscalpel.tune.states import TrialStatus, Verdict
from torchscalpel.tune.verify import (
    MIN_MARGIN,
    loss_deviation,
    noise_fraction,
    numerics_gate,
    required_speedup,
)

REFRESH_EVERY = 2
"""Screening trials between two baseline runs."""

NOISY = 0.15
"""Relative difference between consecutive baseline runs above which the baseline is re-measured
before every screening trial, not every :data:`REFRESH_EVERY`: on a shared machine whose step time
swings 2-3x within minutes, a baseline two trials old says little about the load a trial ran at."""

OUTLIER_BASELINE = 0.25
"""A re-measured baseline further than this from the median of the earlier ones is measured once more
before a trial is judged against it (the second run is the one used: a real change of pace repeats, a
moment of load does not)."""

MEMORY_NOTE = 1.25
"""A candidate whose peak memory exceeds the baseline's by this factor gets a note in the table."""


class Search:
    """One tune search over one target (see the module docstring for the steps)."""

    def __init__(self, target: Target, options: TuneOptions, progress: Progress | None = None) -> None:
        self.target = target
        self.options = options
        self.progress = progress or SilentProgress()
        self.budget = Budget(options.budget_s, options.confirm_pairs)
        self.confirm_pairs = options.confirm_pairs
        # None keeps inductor's own per-user cache (or the user's TORCHINDUCTOR_CACHE_DIR), shared
        # by every trial and every tune run: a warm compile costs ~2 s instead of 15-25 s.
        self.cache_dir = options.cache_dir
        self.steps = options.steps
        """Measured steps per trial; raised after the first baseline run when its steps are short."""
        self._n = 0
        self._planned = 2
        """Trial runs planned so far (the "M" of "trial N of M"); stages add and drop runs."""
        self._shown = 0
        """The M the last "trial N of M" showed: a change is said before the next trial (never a silent jump)."""
        self._plan_why: list[str] = []
        """Why M changed since it was last shown."""
        self._refreshes_planned = 0
        """Baseline re-measures counted in M that have not run yet."""
        self.baseline_medians: list[float] = []
        self.determinism = 0.0
        self._ref_ms = 0.0
        self._since_ref = 0
        self._runner_ups: list[TrialResult] = []
        """Combinations faster than the baseline that lost only to the best's *screening* ratio: still
        contenders once a confirmation gives a figure that is not a single noisy screening pair."""

    # -- helpers ----------------------------------------------------------------------------------
    def remaining(self) -> float:
        """Seconds left in the budget."""
        return self.budget.remaining()

    def plan(self, delta: int, why: str = "") -> None:
        """Add (or, negative, drop) runs from the plan shown as "trial N of M"; ``why`` is said with the
        next trial (or at the end), so M never changes without a line saying so."""
        before = self._planned
        self._planned = max(self._n, self._planned + delta)
        if why and self._planned != before:
            self._plan_why.append(why)

    def _say_plan(self, *, ended: bool = False) -> None:
        """Say that M changed since it was last shown, and why (``ended``: the search is over)."""
        if ended and self._planned != self._n:
            self._plan_why.append("nothing further to run")
            self._planned = self._n
        if self._shown and self._planned != self._shown:
            why = "; ".join(dict.fromkeys(self._plan_why)) or "the plan changed"
            head = f"the search ended after {self._n} runs" if ended else f"{self._planned} runs in all"
            self.progress.message(f"plan: {head} (was {self._shown}): {why}")
        self._plan_why.clear()
        self._shown = self._planned

    def trial(
        self,
        settings: TuneSettings,
        family: str,
        *,
        limit_s: float,
        facts: bool = False,
        module_times: bool = False,
        tag: str = "",
        profile_steps: int = 0,
    ) -> TrialResult:
        """Run one trial process, counted in "trial N of M"."""
        self._n += 1
        if self._n > self._planned:  # every stage plans its runs; this only keeps "N of M" true
            self.plan(self._n - self._planned, f"{tag or family} added")
        self._say_plan()
        name = f"{self._n:02d}-{tag or family}"
        self.progress.trial_started(
            settings.label(), limit_s, index=self._n, total=self._planned, left_s=max(0.0, self.remaining())
        )
        kwargs: dict[str, Any] = {}
        if profile_steps:
            kwargs["profile_steps"] = profile_steps
        result = run_trial(
            self.target,
            settings,
            self.options.folder / "trials" / name,
            warmup=self.options.warmup,
            steps=self.steps,
            seed=self.options.seed,
            timeout_s=limit_s,
            family=family,
            facts=facts,
            module_times=module_times,
            cache_dir=self.cache_dir,
            step_kind=self.options.step_kind,
            **kwargs,
        )
        self.progress.trial_finished(result)
        return result

    # -- the search -------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        """Run the whole search within the budget and return what it found.

        Ctrl-C after the baseline ends the search early but still returns what was measured
        (``interrupted`` is set), so the caller can save it; a winner is only kept if confirmed.
        """
        base = self._baseline()
        result = TuneResult(baseline=base, facts=base.facts, measured_steps=self.steps)
        try:
            self._search(result)
        except KeyboardInterrupt:
            result.interrupted = True
            result.notes.append("interrupted (Ctrl-C): the search stopped early; what was measured is kept")
        # Noise over every plain baseline run of the search (the reference, each re-measure, each
        # confirmation baseline), whether or not a confirmation ran: never 0 % over 3570 and 2499 ms.
        result.baseline_medians = [round(m, 3) for m in self.baseline_medians]
        result.noise = noise_fraction(self.baseline_medians) if len(self.baseline_medians) >= 2 else None
        if result.winner is None:
            result.required = required_speedup(result.noise or 0.0)
            busy = self._noise_note(result)
            if busy:
                result.notes.append(busy)
        self._paybacks(result)
        self._say_plan(ended=True)
        result.elapsed_s = self.budget.elapsed()
        return result

    def _paybacks(self, result: TuneResult) -> None:
        """The pays-back figures of every measured candidate with a start-up cost (tune/payback.py)."""
        facts = ModelFacts.from_dict(result.baseline.facts)
        run = run_steps(self.target.args, facts.batches_per_epoch)
        if run is not None:
            result.run_steps, result.run_source = run.steps, run.source
        for trial in result.trials:
            value = payback_of(trial, result.baseline, run)
            trial.payback = value.to_dict() if value is not None else {}

    def _search(self, result: TuneResult) -> None:
        facts = ModelFacts.from_dict(result.baseline.facts)
        knobs = [
            k
            for k in all_knobs(
                compile_backend=self.options.compile_backend, compile_modes=self.options.compile_modes
            )
            if k.name in self.options.knobs
        ]
        singles = self._singles(knobs, facts, result)
        if not any(t.speedup is not None for t in singles):
            result.no_candidate = self._nothing_measured(result)
            result.notes.append(result.no_candidate)
            return  # nothing to combine or confirm, and nothing to recommend
        chosen = winners(singles)
        if not chosen:
            result.notes.append(
                "no single knob was faster than the baseline by the margin with numerics intact"
            )
        best = self._combine(chosen, near_ties(singles, chosen) if chosen else [], result)
        # Confirm the best; if it does not hold up, the next single winners while time allows. A
        # candidate confirmed before the long tail was screened is not confirmed twice; a later one
        # replaces it only with a higher confirmed speedup.
        queue = [t for t in confirm_queue(best, chosen, singles) if t.verdict == Verdict.FASTER]
        for candidate in queue:
            if self._confirm(candidate, result):
                break
            if self.remaining() < self.budget.pair_s(candidate):
                left = queue[queue.index(candidate) + 1 :]
                if left:
                    result.notes.append(
                        f"{', '.join(t.label for t in left)} not confirmed: {self.budget.advice(left[0])}"
                    )
                break
        self._confirm_contenders([*queue, *self._runner_ups], result)

    def _confirm_contenders(self, candidates: list[TrialResult], result: TuneResult) -> None:
        """Once a winner is confirmed, confirm every candidate that *screened* above its confirmed speedup
        by the margin, best first, while the budget buys all its pairs; a higher confirmed one replaces it.

        Why: a screening ratio is one pair, and a noisy baseline beside it inflates it. Seen on a quiet
        machine (tiny Llama): compile(LlamaDecoderLayer) screened 1.78x against a 60.8 ms baseline (the
        others were ~40 ms), so bf16 + compile(LlamaDecoderLayer) at 1.50x "lost" the combination, the
        block confirmed at 1.23x and the search stopped with 193 s of a 360 s budget left, never confirming
        the combination or compile(model) (1.30x screened) that hand-written compile beats."""
        if result.winner is None:
            return
        seen = {result.winner.label}
        ranked = sorted(
            (t for t in candidates if t.verdict in (Verdict.FASTER, Verdict.NOT_FASTER) and t.speedup),
            key=lambda t: -(t.speedup or 0.0),
        )
        for candidate in ranked:
            if candidate.label in seen:
                continue
            seen.add(candidate.label)
            bar = (result.confirmed_speedup or 0.0) * (1 + MIN_MARGIN)
            if (candidate.speedup or 0.0) < bar:
                break  # ranked: no later candidate screened above the bar either
            winner = result.winner
            if self.remaining() < self.budget.confirm_s(candidate):
                result.notes.append(
                    f"{candidate.label} screened {candidate.speedup or 0:.2f}x, above {winner.label}'s confirmed "
                    f"{result.confirmed_speedup or 0:.2f}x, and was not confirmed: {self.budget.advice(candidate)}"
                )
                continue
            self.progress.message(
                f"{candidate.label} screened {candidate.speedup or 0:.2f}x, above {winner.label}'s confirmed "
                f"{result.confirmed_speedup or 0:.2f}x: confirming it too"
            )
            self._confirm(candidate, result)

    def _noise_note(self, result: TuneResult) -> str:
        """On a noisy machine with nothing recommended: what a confirmation needs at this noise."""
        if result.noise is None or result.noise <= NOISY:
            return ""
        measured = [t for t in result.trials if t.speedup is not None and t.wall_s]
        if not measured:
            return ""
        best = max(measured, key=lambda t: t.speedup or 0.0)
        return (
            f"the machine was noisy ({result.noise:.0%} between consecutive baseline runs): a recommendation "
            f"needs the median of {self.confirm_pairs} interleaved pairs at {result.required:.2f}x or more; "
            f"confirming {best.label} takes about {self.budget.confirm_s(best):.0f} s of budget; "
            "rerun on a quieter machine, or with a larger --budget and --min-measure"
        )

    def _confirm(self, candidate: TrialResult, result: TuneResult) -> bool:
        """Confirm ``candidate``; keep the better of it and a winner confirmed earlier."""
        earlier, earlier_speedup = result.winner, result.confirmed_speedup
        if not confirm(self, candidate, result):
            result.winner, result.confirmed_speedup = earlier, earlier_speedup
            return False
        if earlier is not None and (earlier_speedup or 0.0) >= (result.confirmed_speedup or 0.0):
            candidate.verdict = Verdict.NOT_CONFIRMED
            candidate.note = (
                f"confirmed at {result.confirmed_speedup or 0:.2f}x, below {earlier.label}'s "
                f"{earlier_speedup or 0:.2f}x confirmed first"
            )
            result.winner, result.confirmed_speedup = earlier, earlier_speedup
            return True
        if earlier is not None:
            earlier.verdict = Verdict.NOT_CONFIRMED
            earlier.note = f"confirmed at {earlier_speedup or 0:.2f}x; {candidate.label} confirmed higher"
        return True

    def _confirm_before_tail(self, measured: list[TrialResult], result: TuneResult) -> None:
        """Before the first trial the profile does not point at (the long tail), confirm the best
        screening winner so far to the required pairs: the budget goes to the answer first."""
        if result.winner is not None:
            return
        faster = [t for t in measured if t.verdict == Verdict.FASTER]
        if not faster:
            return
        best = max(faster, key=lambda t: t.speedup or 0.0)
        self.progress.message(
            f"{best.label} won screening ({best.speedup or 0:.2f}x): confirming it before the knobs the "
            "profile does not point at"
        )
        self._confirm(best, result)

    def _nothing_measured(self, result: TuneResult) -> str:
        """The sentence for a search that measured no candidate: why, and what to change."""
        rows = [t for t in result.trials if t.family != "baseline"]
        unrun = [t for t in rows if t.verdict == Verdict.NOT_RUN]
        ran = [t for t in rows if t.verdict not in (Verdict.NOT_RUN, Verdict.SKIPPED)]
        rerun = (
            f"rerun with --budget {self.budget.suggest_s([TuneSettings.from_dict(t.settings) for t in unrun])}s"
            if unrun
            else ""
        )
        if unrun and not ran:
            return (
                f"no candidate was measured: the budget ran out after the baseline ({self.budget.elapsed():.0f} s "
                f"of {self.options.budget_s:.0f} s went to the baseline runs, {len(unrun)} trial(s) not run); "
                f"{rerun}"
            )
        if ran:
            causes = ", ".join(f"{t.label}: {t.verdict}" for t in ran)
            return (
                f"no candidate was measured: every trial that ran failed, timed out or changed nothing "
                f"({causes})" + (f"; {len(unrun)} more not run: {rerun}" if unrun else "")
            )
        return "no candidate was measured: no knob applies to this script (each skipped row says why)"

    def _baseline(self) -> TrialResult:
        self.progress.message(
            "baseline: the script as it is (with model facts and a short profile), then once plain for timing"
        )
        budget = self.options.budget_s
        first = self.trial(
            TuneSettings(),
            "baseline",
            limit_s=min(budget * 0.4, self.remaining()),
            facts=True,
            module_times=True,
            tag="baseline-facts",
            profile_steps=profile_steps_for(self.options.steps),
        )
        if not first.ok:
            raise ScalpelError(
                f"The baseline run failed ({first.cause}); fix the script or its arguments first "
                f"(output in {first.out_dir})."
            )
        self.budget.baseline_wall = first.wall_s
        self.steps = self.options.measured_steps(first.median_ms)
        if self.steps != self.options.steps:
            self.progress.message(
                f"steps take {first.median_ms:.1f} ms: every trial measures {self.steps} steps "
                f"(at least {self.options.min_measure_s:g} s of timing)"
            )
        plain = self.trial(
            TuneSettings(),
            "baseline",
            limit_s=min(max(3 * first.wall_s, 30.0), self.remaining()),
            tag="baseline",
        )
        if not plain.ok:
            raise ScalpelError(
                f"The second baseline run failed ({plain.cause}); the script is not repeatable "
                f"(output in {plain.out_dir})."
            )
        plain.facts = dict(first.facts)
        plain.facts["bottleneck"] = classify_trial(first).to_dict()
        plain.verdict = Verdict.BASELINE
        plain.baseline_ms = plain.median_ms
        self.baseline_medians.append(plain.median_ms or 0.0)
        self._ref_ms = plain.median_ms or 0.0
        # The plain run sets the pace: the facts run also profiles and times every submodule.
        self.budget.baseline_wall = plain.wall_s
        # Those hooks slow the facts run's steps, so its estimate of the steps needed is low.
        self.steps = max(self.steps, self.options.measured_steps(plain.median_ms))
        dev, _ = loss_deviation(first.losses, plain.losses)
        self.determinism = dev or 0.0
        return plain

    def _singles(self, knobs: list[Knob], facts: ModelFacts, result: TuneResult) -> list[TrialResult]:
        result.determinism = self.determinism
        planned, skipped = plan_candidates(knobs, facts)
        result.trials.extend(skipped)
        bottleneck = Bottleneck.from_dict(facts.bottleneck)
        self.progress.message(f"profile: {bottleneck.summary()}")
        self.progress.message(
            f"{len(planned)} single-knob trial(s) planned, in the order the profile suggests"
        )
        # Re-measures come before every REFRESH_EVERY-th trial after the first; confirmation runs are
        # planned only once a candidate has won (most searches on a busy machine never get there).
        self._refreshes_planned = max(0, len(planned) - 1) // self._refresh_every()
        self.plan(
            len(planned) + self._refreshes_planned,
            f"{len(planned)} single-knob trial(s) and {self._refreshes_planned} baseline re-measure(s) planned",
        )
        measured: list[TrialResult] = []
        tail_started = False
        for cand in planned:
            settings = cand.settings
            if not cand.indicated and not tail_started:
                tail_started = True
                self._confirm_before_tail(measured, result)
            # No reserve for confirmations that may never run: only once a candidate has won
            # screening is the time its confirmation needs kept back (measured, not guessed).
            keep = max(
                (self.budget.confirm_s(t) for t in measured if t.verdict == Verdict.FASTER), default=0.0
            )
            why_not = self.budget.cannot_run(settings, keep, self._refresh_s())
            if why_not:
                result.trials.append(
                    TrialResult(
                        label=settings.label(),
                        settings=settings.to_dict(),
                        family=cand.knob.name,
                        status=TrialStatus.NOT_RUN,
                        verdict=Verdict.NOT_RUN,
                        cause=why_not,
                        reason=cand.reason,
                        reason_short=cand.short,
                    )
                )
                self.plan(-1, f"{settings.label()} not run (budget)")
                continue
            self._refresh_baseline(result)
            trial = self.trial(
                settings, cand.knob.name, limit_s=min(self.budget.share(settings), self.remaining() - keep)
            )
            trial.reason, trial.reason_short = cand.reason, cand.short
            self._since_ref += 1
            self._judge(trial, result)
            result.trials.append(trial)
            measured.append(trial)
        if self._refreshes_planned:
            self.plan(-self._refreshes_planned, "fewer baseline re-measures than planned")
            self._refreshes_planned = 0
        return measured

    def _refresh_every(self) -> int:
        """Screening trials per baseline re-measure: 1 once consecutive baselines differ by more
        than :data:`NOISY`, else :data:`REFRESH_EVERY`."""
        return 1 if noise_fraction(self.baseline_medians) > NOISY else REFRESH_EVERY

    def _refresh_due(self) -> bool:
        """True when the next trial is preceded by a baseline re-measure."""
        return self._since_ref >= self._refresh_every() and self.remaining() >= 3 * self.budget.baseline_wall

    def _refresh_s(self) -> float:
        """Seconds the baseline re-measure due before the next trial takes (0 when none is due)."""
        return self.budget.baseline_wall if self._refresh_due() else 0.0

    def _refresh_baseline(self, result: TuneResult) -> None:
        """Re-measure the baseline every :data:`REFRESH_EVERY` trials, so screening compares
        each candidate with a baseline measured minutes, not a quarter of an hour, earlier."""
        if not self._refresh_due():
            return
        if self._refreshes_planned:
            self._refreshes_planned -= 1
        else:
            self.plan(
                1,
                "the baseline is re-measured before every trial (consecutive baselines differ by more "
                f"than {NOISY:.0%})"
                if self._refresh_every() == 1
                else "a baseline re-measure",
            )
        ref = self.trial(
            TuneSettings(), "baseline", tag="baseline-refresh", limit_s=self.budget.baseline_limit()
        )
        self._since_ref = 0
        if not (ref.ok and ref.median_ms):
            return
        earlier = statistics.median(self.baseline_medians) if self.baseline_medians else None
        self.baseline_medians.append(ref.median_ms)
        result.baseline_refs.append(round(ref.median_ms, 3))
        self._ref_ms = ref.median_ms
        if (
            earlier
            and abs(ref.median_ms / earlier - 1.0) > OUTLIER_BASELINE
            and self.remaining() >= 3 * self.budget.baseline_wall
        ):
            # One baseline far off the others is as likely a moment of load as a new pace: a trial
            # judged against it screens 1.78x where the pairs then give 1.23x (a tiny Llama on a quiet
            # machine: 60.8 ms between 40.3 and 40.4). The next run decides which it was.
            self.plan(
                1,
                f"a baseline of {ref.median_ms:.1f} ms against {earlier:.1f} ms before it is measured again",
            )
            again = self.trial(
                TuneSettings(), "baseline", tag="baseline-again", limit_s=self.budget.baseline_limit()
            )
            if again.ok and again.median_ms:
                self.baseline_medians.append(again.median_ms)
                result.baseline_refs.append(round(again.median_ms, 3))
                self._ref_ms = again.median_ms

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
        gate = numerics_gate(
            result.baseline.losses, trial.losses, numerics_class(settings), noise=self.determinism
        )
        trial.deviation, trial.tolerance = gate.deviation, gate.tolerance
        # Against the most recent baseline run: load on a shared machine drifts within minutes.
        # The row keeps that baseline's median beside its ratio, so the table says which one it is.
        trial.baseline_ms = self._ref_ms or result.baseline.median_ms
        stamp(trial)  # the screening pair until a confirmation replaces it (torchscalpel.tune.speedup)
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

    def _combine(
        self, chosen: list[TrialResult], ties: list[TrialResult], result: TuneResult
    ) -> TrialResult | None:
        """Greedy combination: each further winner, then each near-tie, merged into the best so far.

        A winner joins when the merged trial's ratio beats the best's by the margin. A near-tie (not slower
        than its baseline, below the margin alone) joins when the merged trial's ratio against the
        baseline beside it is at least the best's: a few percent that screening cannot resolve on
        their own add up on top of a bigger gain, and the confirmation still has to hold.
        """
        if not chosen:
            return None
        current = chosen[0]
        self.plan(len(chosen) - 1 + len(ties), "combining the winners")
        for candidate in [*chosen[1:], *ties]:
            tie = candidate in ties
            # Keep what confirming the current best needs, and nothing more.
            keep = self.budget.confirm_s(current)
            merged = TuneSettings.from_dict(current.settings).merged(
                TuneSettings.from_dict(candidate.settings)
            )
            if self.remaining() - keep - self._refresh_s() < self.budget.need_s(merged):
                result.notes.append(
                    f"not combined with {candidate.label}: the budget left "
                    f"({max(0.0, self.remaining()):.0f} s) is what confirming {current.label} needs"
                )
                self.plan(-1, f"not combined with {candidate.label} (budget)")
                continue
            self._refresh_baseline(result)
            self._since_ref += 1
            trial = self.trial(
                merged,
                "combined",
                limit_s=min(self.budget.share(merged), self.remaining() - keep),
                tag="combined",
            )
            if tie:
                trial.reason = (
                    f"{current.label} with the near-tie {candidate.label} "
                    f"(screened {candidate.speedup or 0:.2f}x alone, below the margin)"
                )
                trial.reason_short = "winner + near-tie"
            else:
                trial.reason = f"combination of the winners {current.label} and {candidate.label}"
                trial.reason_short = "combination of winners"
            self._judge(trial, result)
            result.trials.append(trial)
            if trial.verdict != Verdict.FASTER:
                continue
            # Ratios against the baseline beside each trial: the two ran minutes apart.
            if tie:
                better = (trial.speedup or 0.0) >= (current.speedup or 0.0)
            else:
                better = (trial.speedup or 0.0) > (current.speedup or 0.0) * (1 + MIN_MARGIN)
            if better:
                current = trial
            else:
                trial.verdict = Verdict.NOT_FASTER
                how = "match its ratio" if tie else f"beat it by {MIN_MARGIN:.0%}"
                trial.note = f"adding {candidate.label} to {current.label} did not {how}"
                self._runner_ups.append(trial)
        return current


def tune(target: Target, options: TuneOptions, progress: Progress | None = None) -> TuneResult:
    """Run a tune search (see :class:`Search`)."""
    return Search(target, options, progress).run()


__all__ = [
    "MAX_AUTOTUNE_MIN_S",
    "Progress",
    "Search",
    "SilentProgress",
    "TuneOptions",
    "TuneResult",
    "knob_families",
    "parse_knobs",
    "tune",
]

"""What a tune search found (:class:`TuneResult`), ready for the table, the report and scalpel.toml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchscalpel.sections import TuneSection, is_int
from torchscalpel.tune.apply import code_lines
from torchscalpel.tune.runner import TrialResult
from torchscalpel.tune.settings import TuneSettings
from torchscalpel.tune.speedup import rank_key, speedup_of
from torchscalpel.tune.verify import MIN_MARGIN


@dataclass(kw_only=True, slots=True)
class TuneResult:
    """Everything the search found, ready for the table, the report and scalpel.toml."""

    baseline: TrialResult
    trials: list[TrialResult] = field(default_factory=list)
    """Every candidate (single knobs, combinations), skipped ones included, in the order run."""
    winner: TrialResult | None = None
    """The confirmed configuration, or None when nothing beat the baseline reliably."""
    confirmed_speedup: float | None = None
    """The winner's speedup (:func:`torchscalpel.tune.speedup.speedup_of`, equal to ``winner.speedup``);
    None when nothing is recommended."""
    required: float = 1.0 + MIN_MARGIN
    noise: float | None = None
    """Short-term noise of the plain baseline runs' medians (:func:`torchscalpel.tune.verify.noise_fraction`
    over every one: the reference, each re-measure, each confirmation baseline); None with one run."""
    determinism: float | None = None
    """Loss deviation between two baseline runs with the same seed."""
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    interrupted: bool = False
    """Ctrl-C ended the search early."""
    baseline_refs: list[float] = field(default_factory=list)
    """Median step times of the baseline re-measured between screening trials."""
    measured_steps: int = 0
    """Measured steps per trial after the first baseline run (``TuneOptions.measured_steps``)."""
    baseline_medians: list[float] = field(default_factory=list)
    """Median step time of every plain baseline run, in time order: what ``noise`` is computed over."""
    no_candidate: str = ""
    """When no candidate was measured: the sentence saying why and what to change (else empty)."""
    run_steps: int | None = None
    """The user's run length in steps, when the script's arguments tell it (:mod:`torchscalpel.tune.payback`)."""
    run_source: str = ""
    """Where ``run_steps`` came from (``--steps 2000``)."""

    @property
    def settings(self) -> TuneSettings:
        """The recommended settings (empty: keep the script as it is)."""
        return TuneSettings.from_dict(self.winner.settings) if self.winner else TuneSettings()

    @classmethod
    def from_section(cls, tune: TuneSection) -> TuneResult:
        """The search as its record keeps it (``sections["tune"]``, :meth:`to_dict`): what the terminal and the
        page both render, so the two come from the same data. Raises ValueError when the section has no baseline
        (a hand-made one: there is no search to show)."""
        if tune.baseline is None:
            raise ValueError("sections.tune has no baseline: no search to show")
        run_steps = tune.extra.get("run_steps")
        run_source = tune.extra.get("run_source")
        return cls(
            baseline=TrialResult.from_dict(tune.baseline),
            trials=[TrialResult.from_dict(t) for t in tune.trials],
            winner=TrialResult.from_dict(tune.winner) if tune.winner else None,
            confirmed_speedup=tune.confirmed_speedup,
            # a hand-made section without it: tune's own margin
            required=tune.required_speedup if tune.required_speedup is not None else 1.0 + MIN_MARGIN,
            noise=tune.noise,
            determinism=tune.determinism,
            facts=dict(tune.facts),
            notes=list(tune.notes),
            elapsed_s=tune.elapsed_s or 0.0,
            interrupted=tune.interrupted,
            baseline_refs=list(tune.baseline_refs),
            measured_steps=tune.measured_steps or 0,
            baseline_medians=list(tune.baseline_medians),
            no_candidate=tune.no_candidate,
            run_steps=run_steps if is_int(run_steps) else None,
            run_source=run_source if isinstance(run_source, str) else "",
        )

    def ranked(self) -> list[TrialResult]:
        """Baseline and trials, highest speedup first (:func:`~torchscalpel.tune.speedup.rank_key`);
        unmeasured ones last."""
        return sorted([self.baseline, *self.trials], key=rank_key)

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
            "measured_steps": self.measured_steps,
            "baseline_medians": list(self.baseline_medians),
            "no_candidate": self.no_candidate,
            "run_steps": self.run_steps,
            "run_source": self.run_source,
        }

    def headline(self) -> str:
        """The verdict in one line, as the terminal and the demo say it (the report builds the same
        from the record: :func:`torchscalpel.report.tune_sections.build`)."""
        return headline(self.winner.to_dict() if self.winner else None, self.no_candidate)


def headline(winner: dict[str, Any] | None, no_candidate: str) -> str:
    """``recommended: LABEL: 1.32x faster per step than the baseline (3 interleaved pairs, spread ...)``,
    or why nothing is recommended."""
    if winner is not None:
        line = f"recommended: {winner['label']}: {speedup_of(winner).sentence()}"
        payback = winner.get("payback") or {}
        if payback.get("sentence"):
            # per step and end to end said apart (torchscalpel.tune.payback)
            line += f"; {end_to_end_words(payback)}"
        return line
    if no_candidate:
        return f"no change recommended: {no_candidate}"
    return "no change recommended: nothing beat the baseline reliably with numerics intact"


def end_to_end_words(payback: dict[str, Any]) -> str:
    """``end to end over this run's 2,000 steps (--steps 2000): 1.75x with 41.0 s to compile (pays back
    after 95 steps)``, or what is known when the run's length is not."""
    cost = f"{payback.get('one_time_s') or 0.0:.1f} s to {'compile' if payback.get('kind') == 'compile' else 'start'}"
    steps = payback.get("steps")
    back = f"pays back after {steps:,} steps" if steps is not None else "never pays back"
    if payback.get("run_steps") and payback.get("end_to_end") is not None:
        return (
            f"end to end over this run's {payback['run_steps']:,} steps ({payback.get('run_source')}): "
            f"{payback['end_to_end']:.2f}x with {cost} ({back})"
        )
    return f"{cost}, {back}; end to end not measured: the run's length is not known from its arguments"

"""The one speedup of a tune candidate: every place that shows it (the terminal table, the
recommendation, report.html, run.json's ``sections["tune"]``, code.txt, scalpel.toml) asks
:func:`speedup_of` and formats with :meth:`Speedup.text` / :meth:`Speedup.spread_text`.

Definition: the ratio ``baseline ms / candidate ms`` of runs measured beside each other. A candidate
that went through confirmation has interleaved pairs (baseline run, candidate run); its speedup is the
pair whose ratio is the lower median of the pairs' ratios (an actual pair, so the figure always equals
the two step times shown beside it; with an even count the lower of the middle two, never flattering),
and its spread is the lowest and highest pair. A candidate only screened has one pair, its run and the
baseline run measured just before it: its spread is not measured. One definition, so the same run
cannot show a candidate at 1.64x in its table (the screening ratio) and 1.32x in its recommendation
(the confirmation's).

Pure arithmetic on a :class:`~torchscalpel.tune.runner.TrialResult` or its ``to_dict`` form (the report
reads records); no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Speedup:
    """A candidate's speedup and the figures it comes from."""

    ratio: float | None
    """``baseline_ms / candidate_ms`` of the chosen pair (None: nothing measured to compare)."""
    baseline_ms: float | None = None
    """Median step time of the baseline run of the chosen pair."""
    candidate_ms: float | None = None
    """Median step time of the candidate run of the chosen pair."""
    pairs: int = 0
    """Pairs measured: 1 for a screened candidate, the confirmation pairs for a confirmed one."""
    low: float | None = None
    """Lowest pair ratio (None with fewer than two pairs: no spread to measure)."""
    high: float | None = None
    """Highest pair ratio."""
    confirmed: bool = False
    """True when the pairs are interleaved confirmation pairs, False for the screening pair."""

    def text(self) -> str:
        """``1.32x``, or ``-`` when nothing was measured."""
        return "-" if self.ratio is None else f"{self.ratio:.2f}x"

    def spread_text(self) -> str:
        """``1.28-1.40x over 3 pairs``, or why no spread is measured."""
        if self.ratio is None:
            return "-"
        if self.low is None or self.high is None:
            return "not measured: one run"
        return f"{self.low:.2f}-{self.high:.2f}x over {self.pairs} pairs"

    def sentence(self) -> str:
        """``1.32x faster per step than the baseline (3 interleaved pairs, spread 1.28-1.40x)``: the
        recommendation, code.txt and scalpel.toml say it so."""
        if self.ratio is None:
            return "speedup not measured"
        if self.confirmed:
            spread = (
                f"spread {self.low:.2f}-{self.high:.2f}x"
                if self.low is not None and self.high is not None
                else "spread not measured: one pair"
            )
            where = f"{self.pairs} interleaved pair{'s' if self.pairs != 1 else ''}, {spread}"
        else:
            where = "screened once against the baseline run beside it, spread not measured"
        return f"{self.text()} faster per step than the baseline ({where})"

    def to_fields(self) -> dict[str, Any]:
        """What a trial stores beside the ratio in run.json (``TrialResult.speedup_*``)."""
        return {
            "speedup": self.ratio,
            "speedup_pair": None if self.ratio is None else [self.baseline_ms, self.candidate_ms],
            "speedup_spread": None if self.low is None else [round(self.low, 4), round(self.high or 0.0, 4)],
        }


def _get(trial: Any, key: str) -> Any:
    return trial.get(key) if isinstance(trial, Mapping) else getattr(trial, key, None)


def measured_pairs(trial: Any) -> tuple[list[tuple[float, float]], bool]:
    """The (baseline ms, candidate ms) pairs a candidate was measured in, and whether they are
    confirmation pairs: those when it went through confirmation, else its screening pair."""
    pairs = [(float(b), float(c)) for b, c in (_get(trial, "confirm_pairs") or []) if b and c]
    if pairs:
        return pairs, True
    base, cand = _get(trial, "baseline_ms"), _get(trial, "median_ms")
    return ([(float(base), float(cand))] if base and cand else []), False


def speedup_of(trial: Any) -> Speedup:
    """The speedup of ``trial`` (a ``TrialResult`` or its dict), by the module's one definition."""
    if str(_get(trial, "verdict") or "") == "baseline":
        ms = _get(trial, "median_ms")
        return Speedup(ratio=1.0 if ms else None, baseline_ms=ms, candidate_ms=ms, pairs=1 if ms else 0)
    pairs, confirmed = measured_pairs(trial)
    if not pairs:
        return Speedup(ratio=None)
    ranked = sorted(pairs, key=lambda p: p[0] / p[1])
    base, cand = ranked[(len(ranked) - 1) // 2]  # the lower median: an actual pair
    ratios = [b / c for b, c in ranked]
    spread = (ratios[0], ratios[-1]) if len(ratios) >= 2 else (None, None)
    return Speedup(
        ratio=base / cand,
        baseline_ms=base,
        candidate_ms=cand,
        pairs=len(pairs),
        low=spread[0],
        high=spread[1],
        confirmed=confirmed,
    )


def stamp(trial: Any) -> Speedup:
    """Set ``trial``'s stored speedup fields (``speedup``, ``speedup_pair``, ``speedup_spread``) from
    :func:`speedup_of` and return it: run.json holds exactly what the table and the report show."""
    value = speedup_of(trial)
    for key, field_value in value.to_fields().items():
        setattr(trial, key, field_value)
    return value


def shown_ms(trial: Any) -> float | None:
    """The step time a table row shows (and is ranked by): the candidate run of the pair its speedup is
    the ratio of, else its own median (a failed or unmeasured row has none)."""
    value = speedup_of(trial)
    return value.candidate_ms if value.ratio is not None else _get(trial, "median_ms")


RANK_ORDER = "ranked by speedup per step (each against the baseline run beside it)"
"""What the ranked tables (terminal, report.html) say their order is; :func:`rank_key` is that order."""


def rank_key(trial: Any) -> tuple[bool, float, float]:
    """Sort key of the ranked tables (:data:`RANK_ORDER`): highest speedup first, unmeasured rows last.

    By speedup, not raw step time: rows are measured in pairs minutes apart (a screening pair, a
    confirmation pair), and a confirmed row's step time at a busier minute is no slower a knob."""
    value = speedup_of(trial)
    ms = shown_ms(trial)
    return (value.ratio is None, -(value.ratio or 0.0), ms or 0.0)

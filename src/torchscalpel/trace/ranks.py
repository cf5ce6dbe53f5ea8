"""Across ranks: stragglers (step time and collective wait per rank) and overlap per rank.

:func:`straggler_verdict` is the one straggler rule: ``scalpel analyze`` (:func:`stragglers`, over trace
files) and ``scalpel launch --profile`` (:mod:`torchscalpel.distributed.rankmerge`, over the ranks' run
records) both call it, each with every rank's per-step times.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MIN_STEPS = 3
"""Steps per rank a spread needs: with fewer, the straggler verdict is "not measured"."""
NOISE_SIGMAS = 2.0
"""A straggler's median must clear each other rank's median by this many (robust) sigmas of the two ranks together."""
MIN_GAP_MS = 0.05
"""Below this a gap is timer and scheduler jitter, whatever the spreads say (0.21 vs 0.25 ms named a straggler)."""
MIN_GAP_SHARE = 0.10
"""A straggler costs every other rank at least this share of its step; smaller gaps are not worth a name."""
MAD_TO_SIGMA = 1.4826
"""Median absolute deviation to standard deviation for normal data: a spread that one outlier step cannot inflate."""


@dataclass(frozen=True, slots=True)
class RankTime:
    """One rank's figure: the median of its per-step times and their spread (ms)."""

    rank: int
    median_ms: float
    noise_ms: float
    """1.4826 x the median absolute deviation of the rank's step times (a robust sigma)."""
    steps: int


@dataclass(frozen=True, slots=True)
class StragglerVerdict:
    """Whether one rank is slower than the others beyond their noise, and the figures that say so."""

    measured: bool
    """False when some rank had too few steps for a spread (``sentence`` says which)."""
    rank: int | None
    """The straggler, or None (none found, or not measured)."""
    sentence: str
    """What the terminal, the report and ``launch.json`` print, both figures included."""
    what: str
    """What each rank's figure counts (``per step``, ``per step outside collectives``)."""
    ranks: list[RankTime] = field(default_factory=list)
    candidate: int | None = None
    """The rank with the slowest median (named only when ``rank`` is set)."""
    compared_with: int | None = None
    """The other rank it was hardest to clear: the highest median plus the gap it would need."""
    gap_ms: float | None = None
    """Candidate's median minus ``compared_with``'s."""
    needed_ms: float | None = None
    """The gap a straggler needs over ``compared_with``: the larger of two sigmas of both ranks' noise,
    :data:`MIN_GAP_MS` and :data:`MIN_GAP_SHARE` of that rank's median."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return asdict(self)


def rank_time(rank: int, times_ms: Sequence[float]) -> RankTime:
    """Median and robust spread of one rank's per-step times."""
    med = statistics.median(times_ms)
    mad = statistics.median(abs(t - med) for t in times_ms)
    return RankTime(rank=rank, median_ms=med, noise_ms=MAD_TO_SIGMA * mad, steps=len(times_ms))


def needed_gap(slow: RankTime, other: RankTime) -> float:
    """The gap ``slow``'s median must exceed over ``other``'s to be outside the other's spread."""
    return max(NOISE_SIGMAS * (slow.noise_ms + other.noise_ms), MIN_GAP_MS, MIN_GAP_SHARE * other.median_ms)


def straggler_verdict(per_rank: Mapping[int, Sequence[float]], *, what: str = "per step") -> StragglerVerdict:
    """The straggler rule: the rank with the slowest median step is named only when, against every other
    rank, its median exceeds that rank's by more than :func:`needed_gap` (the two ranks' noise, an
    absolute minimum and a share of the step). ``per_rank`` maps rank to its per-step times in ms (the
    time the rank works, i.e. outside collectives where those are measured: in a synchronous job
    every rank's wall step is as long as the slowest one's)."""
    if len(per_rank) < 2:
        return StragglerVerdict(
            measured=False,
            rank=None,
            what=what,
            sentence="not measured: one rank, nothing to compare it with",
        )
    short = {r: len(v) for r, v in per_rank.items() if len(v) < MIN_STEPS}
    if short:
        listed = ", ".join(f"rank {r} has {n}" for r, n in sorted(short.items()))
        return StragglerVerdict(
            measured=False,
            rank=None,
            what=what,
            sentence=f"not measured: {listed} step{'s' if max(short.values()) != 1 else ''}; "
            f"a spread needs {MIN_STEPS} per rank",
        )
    times = [rank_time(r, v) for r, v in sorted(per_rank.items())]
    slow = max(times, key=lambda t: t.median_ms)
    others = [t for t in times if t.rank != slow.rank]
    hardest = max(others, key=lambda t: t.median_ms + needed_gap(slow, t))
    gap, needed = slow.median_ms - hardest.median_ms, needed_gap(slow, hardest)
    share = gap / hardest.median_ms if hardest.median_ms > 0 else 0.0
    figures = (
        f"{slow.median_ms:.2f} ms ±{slow.noise_ms:.2f} {what} against rank {hardest.rank}'s "
        f"{hardest.median_ms:.2f} ms ±{hardest.noise_ms:.2f}: {gap:.2f} ms ({share:.0%}) slower"
    )
    named = gap > needed
    if named:
        sentence = f"rank {slow.rank}: {figures}, beyond the {needed:.2f} ms a straggler needs; the other ranks wait for it"
    else:
        sentence = (
            f"none: rank {slow.rank}'s {figures}, within the {needed:.2f} ms a straggler needs (two sigmas of "
            f"both ranks' noise, at least {MIN_GAP_MS} ms and {MIN_GAP_SHARE:.0%} of the step)"
        )
    return StragglerVerdict(
        measured=True,
        rank=slow.rank if named else None,
        sentence=sentence,
        what=what,
        ranks=times,
        candidate=slow.rank,
        compared_with=hardest.rank,
        gap_ms=gap,
        needed_ms=needed,
    )


def outside_collectives_us(step: Mapping[str, Any]) -> tuple[float, bool]:
    """A trace step's time outside collectives (µs) and whether a collective time was subtracted: GPU
    communication kernels not overlapped by compute where the trace has a GPU, else the wall time of
    gloo's collectives (``collective_wall_us``: they include the wait for the other ranks, which the
    enqueuing CPU op does not), else the CPU ops' ``communication`` self time; the step's duration when
    none is recorded."""
    comm = step.get("communication_us")
    if comm is None:
        comm = step.get("collective_wall_us")
    if comm is None:
        comm = (step.get("cpu_categories") or {}).get("communication")
    return float(step["dur_us"]) - float(comm or 0.0), comm is not None


def stragglers(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per step name present on every rank: each rank's step time and communication time, and the
    straggler verdict (:func:`straggler_verdict`) over the steps' time outside collectives."""
    if len(ranks) < 2 or len({r["rank"] for r in ranks}) != len(ranks):
        return None  # one rank, or files of different runs that share a rank number: nothing to compare
    by_rank = {r["rank"]: {s["name"]: s for s in r.get("steps", [])} for r in ranks}
    common = set.intersection(*(set(v) for v in by_rank.values())) if by_rank else set()
    if not common:
        return None
    rows = []
    busy: dict[int, list[float]] = {r: [] for r in by_rank}
    subtracted = True
    for name in sorted(common, key=lambda n: min(by_rank[r][n]["start_us"] for r in by_rank)):
        per = {r: by_rank[r][name] for r in by_rank}
        durs = {r: s["dur_us"] for r, s in per.items()}
        comm = {r: s.get("communication_us") for r, s in per.items()}
        med = statistics.median(durs.values())
        rows.append(
            {
                "step": name,
                "dur_us": durs,
                "communication_us": comm if all(v is not None for v in comm.values()) else None,
                "slowest_rank": max(durs, key=lambda r: durs[r]),
                "spread_pct": round(100.0 * (max(durs.values()) - min(durs.values())) / med, 2)
                if med > 0
                else 0.0,
            }
        )
        for r, s in per.items():
            value, had = outside_collectives_us(s)
            busy[r].append(value / 1e3)
            subtracted = subtracted and had
    mean_dur = {r: statistics.fmean(row["dur_us"][r] for row in rows) for r in by_rank}
    out: dict[str, Any] = {"steps": rows, "mean_step_us": mean_dur}
    if all(row["communication_us"] is not None for row in rows):
        out["mean_communication_us"] = {
            r: statistics.fmean(row["communication_us"][r] for row in rows) for r in by_rank
        }
    verdict = straggler_verdict(busy, what="per step outside collectives" if subtracted else "per step")
    out["verdict"] = verdict.to_dict()
    if verdict.rank is not None:
        out["likely_straggler"] = verdict.rank
        out["reason"] = verdict.sentence
    return out

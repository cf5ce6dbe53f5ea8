"""Across ranks: stragglers (step time and collective wait per rank) and overlap per rank."""

from __future__ import annotations

import statistics
from typing import Any


def stragglers(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per step name present on every rank: each rank's step time and communication time.

    The rank that waits least in collectives while its step is as long as the others' is the one
    the others wait for: it is reported as the likely straggler when the spread is above 5%.
    """
    if len(ranks) < 2 or len({r["rank"] for r in ranks}) != len(ranks):
        return None  # one rank, or files of different runs that share a rank number: nothing to compare
    by_rank = {r["rank"]: {s["name"]: s for s in r.get("steps", [])} for r in ranks}
    common = set.intersection(*(set(v) for v in by_rank.values())) if by_rank else set()
    if not common:
        return None
    rows = []
    for name in sorted(common, key=lambda n: min(by_rank[r][n]["start_us"] for r in by_rank)):
        per = {r: by_rank[r][name] for r in by_rank}
        durs = {r: s["dur_us"] for r, s in per.items()}
        comm = {r: s.get("communication_us") for r, s in per.items()}
        med = statistics.median(durs.values())
        rows.append({
            "step": name,
            "dur_us": durs,
            "communication_us": comm if all(v is not None for v in comm.values()) else None,
            "slowest_rank": max(durs, key=lambda r: durs[r]),
            "spread_pct": round(100.0 * (max(durs.values()) - min(durs.values())) / med, 2) if med > 0 else 0.0,
        })
    mean_dur = {r: statistics.fmean(row["dur_us"][r] for row in rows) for r in by_rank}
    out: dict[str, Any] = {"steps": rows, "mean_step_us": mean_dur}
    if all(row["communication_us"] is not None for row in rows):
        mean_comm = {r: statistics.fmean(row["communication_us"][r] for row in rows) for r in by_rank}
        out["mean_communication_us"] = mean_comm
        lo, hi = min(mean_comm.values()), max(mean_comm.values())
        if hi > 0 and (hi - lo) / hi > 0.05:
            out["likely_straggler"] = min(mean_comm, key=lambda r: mean_comm[r])
            out["reason"] = (f"rank {out['likely_straggler']} spends the least time in collectives "
                             f"({lo / 1e3:.2f} ms vs up to {hi / 1e3:.2f} ms per step): the others wait for it")
    return out

"""Merge the per-rank Run records of ``scalpel launch --profile``/``--doctor`` into one view.

Per rank: median step time, time in collectives per step (the ``communication`` category of the
profiler window), compute time (the rest). The likely straggler is the rank that spends the least
time in collectives while the others wait for it (same rule as :mod:`torchscalpel.trace.ranks`:
reported when the spread of collective time is above 5%). Findings from every rank are merged
with the ranks that raised them.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from torchscalpel.record import RunRecord, load_record

STRAGGLER_SPREAD = 0.05


def load_rank_records(base: Path) -> dict[int, RunRecord]:
    """``rank-R/run.json`` under ``base``, by rank (missing ranks are skipped)."""
    records = {}
    for folder in sorted(base.glob("rank-*")):
        suffix = folder.name.split("-", 1)[1]
        if suffix.isdigit() and (folder / "run.json").is_file():
            records[int(suffix)] = load_record(folder)
    return records


STEP_TIME_MEANS = ("step ms: median of the measured steps outside the profiler window (profiled steps are slower and "
                   "left out, as in each rank's own summary); collective and compute ms: per profiled step")
"""Said once under the table: what each time column counts."""


def rank_row(rank: int, record: RunRecord) -> dict[str, Any]:
    """One rank's figures in milliseconds (None where the record has no value).

    ``step_ms`` follows the rank's own summary (:func:`torchscalpel.runtime.summary.run_summary`):
    profiled steps are left out when unprofiled measured steps exist. Collective time comes from the
    profiler window, so ``compute_ms`` is the median *profiled* step minus it (both from the same steps)."""
    measured = record.measured_steps
    plain = [s for s in measured if not s.profiled] or measured
    profiled = [s for s in measured if s.profiled]
    step_ms = statistics.median(s.total_ms for s in plain) if plain else None
    window = record.profiler_view().steps or []
    comm_us = (record.op_summary_view().categories or {}).get("communication")
    comm_ms = comm_us / 1000.0 / len(window) if (comm_us is not None and window) else None
    window_ms = statistics.median(s.total_ms for s in profiled) if profiled else step_ms
    return {
        "rank": rank,
        "status": record.status,
        "steps": len(record.measured_steps),
        "step_ms": step_ms,
        "collective_ms": comm_ms,
        "compute_ms": window_ms - comm_ms if (window_ms is not None and comm_ms is not None) else None,
        "data_ms": statistics.median([s.data_ms for s in plain]) if plain else None,
    }


def merge(records: dict[int, RunRecord]) -> dict[str, Any]:
    """Per-rank rows, the straggler verdict and merged findings."""
    rows = [rank_row(r, rec) for r, rec in sorted(records.items())]
    out: dict[str, Any] = {"ranks": rows, "straggler": None}
    comm = {row["rank"]: row["collective_ms"] for row in rows if row["collective_ms"] is not None}
    if len(comm) >= 2:
        lo, hi = min(comm.values()), max(comm.values())
        if hi > 0 and (hi - lo) / hi > STRAGGLER_SPREAD:
            slow = min(comm, key=lambda r: comm[r])
            out["straggler"] = {
                "rank": slow,
                "reason": f"rank {slow} spends the least time in collectives ({lo:.2f} ms vs up to {hi:.2f} ms per "
                "step): the other ranks wait for it",
            }
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for rank, record in sorted(records.items()):
        for finding in record.findings:
            key = (str(finding.get("rule", "")), str(finding.get("message", "")))
            entry = merged.setdefault(key, {**finding, "ranks": []})
            entry["ranks"].append(rank)
    out["findings"] = list(merged.values())
    return out


def format_table(merged: dict[str, Any]) -> str:
    """Plain-text table for the terminal."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = ["rank  status     steps  step ms  collective ms  compute ms  data ms"]  # what they mean: once, below
    for row in merged["ranks"]:
        lines.append(
            f"{row['rank']:>4}  {row['status']:<9} {row['steps']:>6}  {ms(row['step_ms']):>7}  "
            f"{ms(row['collective_ms']):>13}  {ms(row['compute_ms']):>10}  {ms(row['data_ms']):>7}"
        )
    if merged["ranks"]:
        lines.append(STEP_TIME_MEANS)
    straggler = merged.get("straggler")
    lines.append(f"straggler: {straggler['reason']}" if straggler else "straggler: none (collective time within 5% across ranks)")
    for finding in merged.get("findings", []):
        ranks = ",".join(str(r) for r in finding["ranks"])
        lines.append(f"[{finding.get('severity', '?')}] {finding.get('message', '')} (ranks {ranks})")
    return "\n".join(lines)

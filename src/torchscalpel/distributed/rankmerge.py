"""Merge the per-rank Run records of ``scalpel launch --profile``/``--doctor`` into one view.

Per rank: median step time, time in collectives per step (the ``communication`` category of the
profiler window), compute time (the rest). The straggler verdict is
:func:`torchscalpel.trace.ranks.straggler_verdict`, the rule ``scalpel analyze`` uses too, over each rank's
profiled steps less their time in collectives (each rank's measured step times when a rank has no
per-step trace figures). Findings from every rank are merged with the ranks that raised them.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from torchscalpel.record import RunRecord, load_record
from torchscalpel.trace.ranks import StragglerVerdict, outside_collectives_us, straggler_verdict


def load_rank_records(base: Path) -> dict[int, RunRecord]:
    """``rank-R/run.json`` under ``base``, by rank (missing ranks are skipped)."""
    records = {}
    for folder in sorted(base.glob("rank-*")):
        suffix = folder.name.split("-", 1)[1]
        if suffix.isdigit() and (folder / "run.json").is_file():
            records[int(suffix)] = load_record(folder)
    return records


STEP_TIME_MEANS = (
    "step ms: median of the measured steps outside the profiler window (profiled steps are slower and "
    "left out, as in each rank's own summary); collective and compute ms: per profiled step"
)
"""Said once under the table: what each time column counts."""


def _collective_ms(record: RunRecord) -> float | None:
    """Mean collective time per profiled step from the trace's steps, by the straggler rule's own measure
    (:func:`~torchscalpel.trace.ranks.outside_collectives_us`: gloo's wall time, waits included, on CPU);
    None when the trace has no per-step collective figure."""
    trace_ranks = record.op_summary_view().ranks
    steps = trace_ranks[0].get("steps") if len(trace_ranks) == 1 else None
    if not steps:
        return None
    parts = [outside_collectives_us(s) for s in steps]
    if not all(had for _, had in parts):
        return None
    return (
        statistics.fmean(float(s["dur_us"]) - busy for s, (busy, _) in zip(steps, parts, strict=True))
        / 1000.0
    )


def rank_row(rank: int, record: RunRecord) -> dict[str, Any]:
    """One rank's figures in milliseconds (None where the record has no value).

    ``step_ms`` follows the rank's own summary (:func:`torchscalpel.runtime.summary.run_summary`):
    instrumented steps are left out (no step time when every measured step was). Collective time comes from the
    profiler window, so ``compute_ms`` is the median *profiled* step minus it (both from the same steps)."""
    measured = record.measured_steps
    plain = record.timed_steps
    profiled = [s for s in measured if s.profiled]
    step_ms = statistics.median(s.total_ms for s in plain) if plain else None
    window = record.profiler_view().steps or []
    comm_ms = _collective_ms(record)
    if comm_ms is None:  # no per-step trace figures: the window's communication ops over its steps
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


def rank_step_times(records: dict[int, RunRecord]) -> StragglerVerdict:
    """The straggler verdict over every rank's per-step times: the profiled steps' time outside collectives
    when every rank's trace has per-step figures (in a synchronous job the wall step is the slowest rank's
    on every rank, so only the time outside collectives tells them apart), else the measured steps'
    wall times (those the step ms column summarizes)."""
    traced: dict[int, list[float]] = {}
    subtracted = True
    for rank, record in records.items():
        trace_ranks = record.op_summary_view().ranks
        steps = trace_ranks[0].get("steps") if len(trace_ranks) == 1 else None
        if not steps:
            break
        values = []
        for step in steps:
            value, had = outside_collectives_us(step)
            values.append(value / 1e3)
            subtracted = subtracted and had
        traced[rank] = values
    else:
        what = "per profiled step outside collectives" if subtracted else "per profiled step"
        return straggler_verdict(traced, what=what)
    plain = {}
    for rank, record in records.items():
        plain[rank] = [s.total_ms for s in record.timed_steps]
    return straggler_verdict(plain, what="per step")


def merge(records: dict[int, RunRecord]) -> dict[str, Any]:
    """Per-rank rows, the straggler verdict and merged findings."""
    rows = [rank_row(r, rec) for r, rec in sorted(records.items())]
    verdict = rank_step_times(records)
    out: dict[str, Any] = {"ranks": rows, "straggler": None, "straggler_verdict": verdict.to_dict()}
    if verdict.rank is not None:
        out["straggler"] = {"rank": verdict.rank, "reason": verdict.sentence}
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for rank, record in sorted(records.items()):
        for finding in record.findings:
            key = (str(finding.get("rule", "")), str(finding.get("message", "")))
            entry = merged.setdefault(key, {**finding, "ranks": []})
            entry["ranks"].append(rank)
    out["findings"] = list(merged.values())
    return out

"""``--diff``: op- and kernel-level comparison of two analyses (counts, time, added and removed)."""

from __future__ import annotations

from typing import Any

from torchscalpel.trace.analyze import TraceAnalysis
from torchscalpel.trace.categories import categorize


def _table_diff(a: dict[str, list[float]], b: dict[str, list[float]], time_index: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for name in set(a) | set(b):
        va, vb = a.get(name), b.get(name)
        ta = va[time_index] if va else 0.0
        tb = vb[time_index] if vb else 0.0
        status = (
            "added"
            if va is None
            else "removed"
            if vb is None
            else ("same" if (va[0], ta) == (vb[0], tb) else "changed")
        )
        rows.append(
            {
                "name": name,
                "category": categorize(name),
                "status": status,
                "count_a": int(va[0]) if va else 0,
                "count_b": int(vb[0]) if vb else 0,
                "time_a_us": ta,
                "time_b_us": tb,
                "delta_us": tb - ta,
                "delta_pct": round(100.0 * (tb - ta) / ta, 2) if ta > 0 else None,
            }
        )
    rows.sort(key=lambda r: (-abs(r["delta_us"]), r["name"]))
    return {
        "rows": rows,
        "added": sorted(r["name"] for r in rows if r["status"] == "added"),
        "removed": sorted(r["name"] for r in rows if r["status"] == "removed"),
        "time_a_us": sum(r["time_a_us"] for r in rows),
        "time_b_us": sum(r["time_b_us"] for r in rows),
    }


def _mean_step(result: TraceAnalysis) -> float | None:
    durs = [s["dur_us"] for r in result.ranks for s in r.get("steps", [])]
    return sum(durs) / len(durs) if durs else None


def diff_results(a: TraceAnalysis, b: TraceAnalysis) -> dict[str, Any]:
    """B relative to A: CPU ops compared on self time, kernels on total time; rows by |change|."""
    return {
        "a": [r["path"] for r in a.ranks],
        "b": [r["path"] for r in b.ranks],
        "mean_step_us": {"a": _mean_step(a), "b": _mean_step(b)},
        "ops": _table_diff(a.op_table, b.op_table, time_index=1),
        "kernels": _table_diff(a.kernel_table, b.kernel_table, time_index=2),
    }

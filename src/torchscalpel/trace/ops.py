"""CPU op self time (time not spent in nested child ops on the same thread) and top-N tables."""

from __future__ import annotations

from typing import Any

import numpy as np

from torchscalpel.trace.categories import categorize
from torchscalpel.trace.collect import RankData


def op_self_times(d: RankData) -> np.ndarray:
    """Self time of each CPU op: its duration minus the part covered by its direct children."""
    n = len(d.op_ts)
    self_t = d.op_dur.copy()
    if n == 0:
        return self_t
    # per thread, by start time, the longer (outer) op first when two start together
    # memoryviews (ndarray.data), not lists: indexing gives Python numbers without N boxed objects alive
    order = np.lexsort((-d.op_dur, d.op_ts, d.op_tid)).data
    ts = np.ascontiguousarray(d.op_ts).data
    end = (d.op_ts + d.op_dur).data
    tid = np.ascontiguousarray(d.op_tid).data
    child_arr = np.zeros(n)
    child = child_arr.data
    stack: list[int] = []
    cur_tid = None
    for i in order:
        t = ts[i]
        if tid[i] != cur_tid:
            stack.clear()
            cur_tid = tid[i]
        while stack and end[stack[-1]] <= t:
            stack.pop()
        if stack:
            p = stack[-1]
            child[p] += min(end[i], end[p]) - t
        stack.append(i)
    return np.maximum(self_t - child_arr, 0.0)


def aggregate_ops(d: RankData, op_self: np.ndarray) -> dict[int, list[float]]:
    """name id -> [count, self_us, total_us] for the CPU ops of one rank."""
    if len(d.op_name) == 0:
        return {}
    uniq, inv = np.unique(d.op_name, return_inverse=True)
    count = np.bincount(inv)
    self_sum = np.bincount(inv, weights=op_self)
    total = np.bincount(inv, weights=d.op_dur)
    return {
        int(u): [float(c), float(s), float(t)]
        for u, c, s, t in zip(uniq, count, self_sum, total, strict=True)
    }


def top_table(agg: dict[str, list[float]], top: int) -> list[dict[str, Any]]:
    """Rows ``{name, category, count, self_us, total_us}`` sorted by self time."""
    rows: list[dict[str, Any]] = [
        {"name": name, "category": categorize(name), "count": int(v[0]), "self_us": v[1], "total_us": v[2]}
        for name, v in agg.items()
    ]
    rows.sort(key=lambda r: -r["self_us"])
    return rows[:top] if top else rows


def category_totals(agg: dict[str, list[float]]) -> dict[str, float]:
    """Self time per category, largest first."""
    out: dict[str, float] = {}
    for name, v in agg.items():
        cat = categorize(name)
        out[cat] = out.get(cat, 0.0) + v[1]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))

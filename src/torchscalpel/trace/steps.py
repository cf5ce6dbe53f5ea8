"""Per-step breakdown: step time, GPU busy vs idle, what the GPU ran, why it idled, CPU-side split.

A step is the wall-clock window of its CPU annotation. GPU time inside that window is split
exclusively (each microsecond counted once, priority compute > communication > memcpy > memset),
so ``compute + communication + memcpy + memset + idle == step time``. Idle gaps are classified by
the activity that ends them: *host wait* when it was launched after the GPU went idle (the CPU was
late), *kernel wait* when it was already queued and the gap is at most 30 µs (launch overhead), and
*other* otherwise (waits on events, synchronisation, another stream).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchscalpel.trace.categories import categorize
from torchscalpel.trace.collect import RankData
from torchscalpel.trace.intervals import Coverage, clipped_length, merge

KERNEL_WAIT_MAX_US = 30.0
_HOST, _KERNEL, _OTHER = 0, 1, 2


def step_kinds(d: RankData) -> np.ndarray:
    """0 compute, 1 communication, 2 memcpy, 3 memset for each GPU activity."""
    comm = np.array([categorize(n) == "communication" for n in d.names] or [False], dtype=bool)
    kinds = np.where(comm[d.gpu_name] if len(d.gpu_name) else np.zeros(0, dtype=bool), 1, 0)
    kinds = np.where(d.gpu_kind == 1, 2, kinds)
    return np.where(d.gpu_kind == 2, 3, kinds)


class _Gaps:
    """Idle gaps of the merged GPU timeline, each with its cause."""

    def __init__(self, d: RankData, launch: np.ndarray) -> None:
        work = d.gpu_kind != 3  # synchronisation events are waits, not work
        idx = np.flatnonzero(work)
        ms, me, first = merge(d.gpu_ts[work], d.gpu_ts[work] + d.gpu_dur[work])
        first = idx[first]
        self.ms, self.me = ms, me
        if len(ms) == 0:
            self.start = self.end = np.zeros(0)
            self.cls = np.zeros(0, dtype=np.int64)
            return
        first_launch = launch[first]
        prev_end = np.concatenate([[-np.inf], me])
        nxt_start = np.concatenate([ms, [np.inf]])
        nxt_launch = np.concatenate([first_launch, [np.inf]])
        gap = nxt_start - prev_end
        with np.errstate(invalid="ignore"):
            host = (nxt_launch > prev_end) | np.isinf(gap)
        cls = np.where(host, _HOST, np.where(gap <= KERNEL_WAIT_MAX_US, _KERNEL, _OTHER))
        cls = np.where(np.isnan(nxt_launch) & ~np.isinf(gap), _OTHER, cls)
        self.start, self.end, self.cls = prev_end, nxt_start, cls

    def split(self, lo: float, hi: float) -> np.ndarray:
        if len(self.start) == 0:
            return np.zeros(3)
        i0 = int(np.searchsorted(self.end, lo, side="right"))
        i1 = int(np.searchsorted(self.start, hi, side="left"))
        if i1 <= i0:
            return np.zeros(3)
        s = np.clip(self.start[i0:i1], lo, hi)
        e = np.clip(self.end[i0:i1], lo, hi)
        return np.bincount(self.cls[i0:i1], weights=e - s, minlength=3)


def step_breakdown(d: RankData, launch: np.ndarray, op_self: np.ndarray) -> list[dict[str, Any]]:
    """One dict per step annotation, in time order."""
    if not d.steps:
        return []
    has_gpu = bool((d.gpu_kind != 3).any())
    if has_gpu:
        kinds = step_kinds(d)
        end = d.gpu_ts + d.gpu_dur
        work = d.gpu_kind != 3
        cov = Coverage([(d.gpu_ts[(kinds == k) & work], end[(kinds == k) & work]) for k in range(4)])
        gaps = _Gaps(d, launch)
        order = np.argsort(launch)
        sorted_launch = launch[order]
    op_end = d.op_ts + d.op_dur
    op_cat = np.array([categorize(n) for n in d.names] or ["other"], dtype=object)
    op_order = np.argsort(d.op_ts, kind="stable")
    op_ts_sorted = d.op_ts[op_order]
    op_cat_of = op_cat[d.op_name] if len(d.op_name) else np.zeros(0, dtype=object)
    busy_by_tid: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    # gloo collectives (worker-thread annotations, waits included), merged once: their wall time per step
    coll = merge(d.coll_ts, d.coll_ts + d.coll_dur)[:2] if len(d.coll_ts) else None
    out = []
    for s in d.steps:
        lo, hi = s.start, s.start + s.dur
        row: dict[str, Any] = {"name": s.name, "number": s.number, "start_us": lo, "dur_us": s.dur}
        # CPU side: busy time on the step's thread, self time by category of ops that start in the step
        if s.tid not in busy_by_tid:  # merged once per thread, not once per step
            same = d.op_tid == s.tid
            busy_by_tid[s.tid] = merge(d.op_ts[same], op_end[same])[:2]
        cms, cme = busy_by_tid[s.tid]
        row["cpu_busy_us"] = clipped_length(cms, cme, lo, hi)
        i0, i1 = np.searchsorted(op_ts_sorted, [lo, hi])
        idx = op_order[i0:i1]
        cats: dict[str, float] = {}
        if len(idx):
            step_cats = op_cat_of[idx]
            step_self = op_self[idx]
            for cat in set(step_cats):
                cats[str(cat)] = float(step_self[step_cats == cat].sum())
        row["cpu_categories"] = dict(sorted(cats.items(), key=lambda kv: -kv[1]))
        if coll is not None:
            row["collective_wall_us"] = clipped_length(coll[0], coll[1], lo, hi)
        if has_gpu:
            tot = cov.totals(lo, hi)
            masks = np.arange(16)
            compute = float(tot[(masks & 1) > 0].sum())
            comm = float(tot[((masks & 2) > 0) & ((masks & 1) == 0)].sum())
            memcpy = float(tot[((masks & 4) > 0) & ((masks & 3) == 0)].sum())
            memset = float(tot[8])
            busy = compute + comm + memcpy + memset
            g = gaps.split(lo, hi)
            j0, j1 = np.searchsorted(sorted_launch, [lo, hi])
            row.update(
                {
                    "gpu_busy_us": busy,
                    "gpu_idle_us": s.dur - busy,
                    "compute_us": compute,
                    "communication_us": comm,
                    "memcpy_us": memcpy,
                    "memset_us": memset,
                    "host_wait_us": float(g[_HOST]),
                    "kernel_wait_us": float(g[_KERNEL]),
                    "other_wait_us": float(g[_OTHER]),
                    "gpu_busy_pct": round(100.0 * busy / s.dur, 2) if s.dur > 0 else 0.0,
                    "launched": int(j1 - j0),
                }
            )
        out.append(row)
    return out

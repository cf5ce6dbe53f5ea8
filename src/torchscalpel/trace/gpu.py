"""GPU-side analyses of one rank: HTA-compatible temporal and kernel breakdowns, overlap, launches.

The whole-trace figures use HolisticTraceAnalysis's window and definitions on purpose (so they
agree with its figures): when the trace has two or more step annotations, only GPU activities
launched before the last step starts are counted (the last step is usually cut off by the
profiler), and kernel types come from :func:`~torchscalpel.trace.categories.kernel_type`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchscalpel.trace.categories import categorize, kernel_type
from torchscalpel.trace.collect import RankData
from torchscalpel.trace.intervals import Coverage, merge

HTA_TYPES = ("COMPUTATION", "COMMUNICATION", "MEMORY")
SHORT_KERNEL_US = 10.0


def launch_times(d: RankData) -> np.ndarray:
    """The CPU launch time of each GPU activity (NaN when the trace has no matching launch)."""
    out = np.full(len(d.gpu_ts), np.nan)
    if len(d.launch_corr) == 0 or len(d.gpu_ts) == 0:
        return out
    order = np.argsort(d.launch_corr, kind="stable")
    keys = d.launch_corr[order]
    pos = np.searchsorted(keys, d.gpu_corr)
    pos_c = np.minimum(pos, len(keys) - 1)
    hit = (keys[pos_c] == d.gpu_corr) & (d.gpu_corr >= 0)
    out[hit] = d.launch_ts[order][pos_c[hit]]
    return out


def analysis_window_mask(d: RankData, launch: np.ndarray) -> np.ndarray:
    """GPU activities HTA keeps: with >= 2 step names, those launched before the last step started."""
    step_names = {s.name for s in d.steps}
    if len(step_names) < 2:
        return np.ones(len(d.gpu_ts), dtype=bool)
    last_start = max(s.start for s in d.steps)
    with np.errstate(invalid="ignore"):
        return launch < last_start  # NaN (no launch) compares False: HTA drops those too


def type_codes(d: RankData) -> np.ndarray:
    """HTA kernel type index per GPU activity: 0 COMPUTATION, 1 COMMUNICATION, 2 MEMORY, 3 OTHER."""
    table = np.array([_TYPE_INDEX[kernel_type(n)] for n in d.names] or [3], dtype=np.int8)
    return table[d.gpu_name] if len(d.gpu_name) else np.zeros(0, dtype=np.int8)


_TYPE_INDEX = {"COMPUTATION": 0, "COMMUNICATION": 1, "MEMORY": 2, "OTHER": 3}


def gpu_summary(d: RankData, launch: np.ndarray, *, hta_rounding: bool = False) -> dict[str, Any] | None:
    """Temporal breakdown, kernel-type breakdown, per-kernel statistics and overlap over the window.

    ``hta_rounding`` reproduces HTA's handling of traces with fractional timestamps (start rounded
    up, end rounded down to whole microseconds); off by default because it drops up to 2 µs per
    kernel (docs/analyze.md, "Differences from HTA").
    """
    if len(d.gpu_ts) == 0:
        return None
    keep = analysis_window_mask(d, launch)
    ts, end = d.gpu_ts[keep], d.gpu_ts[keep] + d.gpu_dur[keep]
    if (
        hta_rounding
        and len(d.gpu_ts)
        and (np.any(d.gpu_ts != np.floor(d.gpu_ts)) or np.any(d.op_ts != np.floor(d.op_ts)))
    ):
        ts, end = np.ceil(ts), np.floor(end)
    types = type_codes(d)[keep]
    names = d.gpu_name[keep]
    if len(ts) == 0:
        return None
    ms, me, _ = merge(ts, end)
    kernel_time = float(me[-1] - ms[0])
    busy = float((me - ms).sum())
    idle = kernel_time - busy
    cov = Coverage([(ts[types == i], end[types == i]) for i in range(3)])
    tot = cov.totals()
    compute = float(tot[1] + tot[3] + tot[5] + tot[7])
    comm = float(tot[2] + tot[3] + tot[6] + tot[7])
    overlap = float(tot[3] + tot[7])
    kernel_types: dict[str, float] = {}
    for mask in range(1, 8):
        if tot[mask] > 0:
            label = " overlapping ".join(HTA_TYPES[b] for b in range(3) if mask & (1 << b))
            kernel_types[label] = float(tot[mask])
    return {
        "window": "launched before the last step" if not keep.all() else "whole trace",
        "kernel_time_us": kernel_time,
        "idle_us": idle,
        "compute_us": compute,
        "non_compute_us": kernel_time - compute - idle,
        "idle_pct": _pct(idle, kernel_time),
        "compute_pct": _pct(compute, kernel_time),
        "non_compute_pct": _pct(kernel_time - compute - idle, kernel_time),
        "kernel_types": kernel_types,
        "comm_comp_overlap_pct": _pct(overlap, comm) if comm > 0 else None,
        "kernels": _kernel_stats(d, names, end - ts, types),
    }


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 3) if whole > 0 else 0.0


def _kernel_stats(d: RankData, names: np.ndarray, dur: np.ndarray, types: np.ndarray) -> list[dict[str, Any]]:
    """Per-name count / sum / mean / min / max / sample std, sorted by total time."""
    if len(names) == 0:
        return []
    uniq, inv = np.unique(names, return_inverse=True)
    count = np.bincount(inv)
    total = np.bincount(inv, weights=dur)
    sq = np.bincount(inv, weights=dur * dur)
    mn = np.full(len(uniq), np.inf)
    mx = np.full(len(uniq), -np.inf)
    np.minimum.at(mn, inv, dur)
    np.maximum.at(mx, inv, dur)
    mean = total / count
    var = np.where(count > 1, (sq - count * mean * mean) / np.maximum(count - 1, 1), 0.0)
    std = np.sqrt(np.maximum(var, 0.0))
    ktype = np.zeros(len(uniq), dtype=np.int8)
    ktype[inv] = types
    out = []
    for i in np.argsort(-total, kind="stable"):
        name = d.names[int(uniq[i])]
        out.append(
            {
                "name": name,
                "category": categorize(name),
                "kernel_type": list(_TYPE_INDEX)[int(ktype[i])],
                "count": int(count[i]),
                "total_us": float(total[i]),
                "self_us": float(total[i]),
                "mean_us": float(mean[i]),
                "min_us": float(mn[i]),
                "max_us": float(mx[i]),
                "std_us": float(std[i]),
            }
        )
    return out


def launch_stats(d: RankData, launch: np.ndarray) -> dict[str, Any] | None:
    """Kernel count, kernels shorter than 10 µs, launch-to-start delay (kernels only, whole trace)."""
    is_kernel = d.gpu_kind == 0
    n = int(is_kernel.sum())
    if n == 0:
        return None
    dur = d.gpu_dur[is_kernel]
    delay = (d.gpu_ts - launch)[is_kernel]
    delay = delay[~np.isnan(delay)]
    out: dict[str, Any] = {
        "kernels": n,
        "short_kernels": int((dur < SHORT_KERNEL_US).sum()),
        "short_kernel_pct": _pct(float((dur < SHORT_KERNEL_US).sum()), n),
        "mean_kernel_us": float(dur.mean()),
        "launches_matched": len(delay),
    }
    if len(delay):
        out.update(
            {
                "launch_delay_mean_us": float(delay.mean()),
                "launch_delay_p50_us": float(np.percentile(delay, 50)),
                "launch_delay_p95_us": float(np.percentile(delay, 95)),
                "launch_delay_max_us": float(delay.max()),
            }
        )
    return out

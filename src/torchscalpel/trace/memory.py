"""Allocator memory timeline from ``[memory]`` instant events: peak, when, under which op."""

from __future__ import annotations

from typing import Any

import numpy as np

from torchscalpel.trace.collect import RankData

# c10::DeviceType values seen in traces
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 8: "xla", 9: "mps", 12: "meta", 20: "privateuse1"}
TIMELINE_POINTS = 300


def memory_summary(d: RankData) -> dict[str, Any] | None:
    """Peak ``Total Allocated`` (bytes), its time, the innermost CPU op running then, and a timeline."""
    if len(d.mem_ts) == 0:
        return None
    per_device: dict[str, float] = {}
    for dev in np.unique(d.mem_device):
        sel = d.mem_device == dev
        per_device[DEVICE_TYPES.get(int(dev), f"device{int(dev)}")] = float(d.mem_total[sel].max())
    i = int(np.argmax(d.mem_total))
    ts = float(d.mem_ts[i])
    dev = int(d.mem_device[i])
    sel = (d.op_tid == d.mem_tid[i]) & (d.op_ts <= ts) & (d.op_ts + d.op_dur >= ts)
    if not sel.any():  # allocations from another thread: any op running at that time
        sel = (d.op_ts <= ts) & (d.op_ts + d.op_dur >= ts)
    peak_op = None
    if sel.any():
        cand = np.flatnonzero(sel)
        peak_op = d.names[int(d.op_name[cand[np.argmin(d.op_dur[cand])]])]
    dev_sel = d.mem_device == dev
    starts = [float(d.mem_ts.min())] + ([float(d.op_ts.min())] if len(d.op_ts) else [])
    return {
        "peak_bytes": float(d.mem_total[i]),
        "peak_ts_us": ts,
        "peak_ms_from_start": (ts - min(starts))
        / 1e3,  # what people read: ms into the trace, not a clock value
        "peak_op": peak_op,
        "device": DEVICE_TYPES.get(dev, f"device{dev}"),
        "peak_by_device": per_device,
        "events": len(d.mem_ts),
        "timeline": _downsample(d.mem_ts[dev_sel], d.mem_total[dev_sel]),
    }


def _downsample(ts: np.ndarray, val: np.ndarray) -> list[list[float]]:
    """At most :data:`TIMELINE_POINTS` ``[ts, bytes]`` points keeping each bucket's maximum."""
    order = np.argsort(ts, kind="stable")
    ts, val = ts[order], val[order]
    if len(ts) <= TIMELINE_POINTS:
        return [[float(t), float(v)] for t, v in zip(ts, val, strict=True)]
    out = []
    for chunk in np.array_split(np.arange(len(ts)), TIMELINE_POINTS):
        j = chunk[np.argmax(val[chunk])]
        out.append([float(ts[j]), float(val[j])])
    return out

"""Runs inside the benchmark-only venv that has HolisticTraceAnalysis (never imported by torchscalpel).

Usage: python _hta_worker.py record OUT.json TRACE...   (figures for tests/data/hta_*.json)
       python _hta_worker.py bench TRACE_DIR             (temporal + kernel breakdown, timed)
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import time

logging.disable(logging.WARNING)


def _analysis(trace_dir: str):
    from hta.trace_analysis import TraceAnalysis

    return TraceAnalysis(trace_dir=trace_dir)


def record(out: str, traces: list[str]) -> None:
    d = tempfile.mkdtemp()
    for t in traces:
        shutil.copy(t, d)
    ta = _analysis(d)
    tb = ta.get_temporal_breakdown(visualize=False)
    ktype, kall = ta.get_gpu_kernel_breakdown(
        visualize=False, num_kernels=10**9, duration_ratio=1.0, include_memory_kernels=True
    )
    try:
        overlap = ta.get_comm_comp_overlap(visualize=False)
        overlap_rows = {int(r["rank"]): float(r["comp_comm_overlap_pctg"]) for _, r in overlap.iterrows()}
    except Exception:  # HTA fails on traces without communication kernels
        overlap_rows = {}
    rec = {
        "source": "holistictraceanalysis "
        + __import__("importlib.metadata").metadata.version("holistictraceanalysis"),
        "traces": [t.split("/traces/")[-1] for t in traces],
        "temporal": [
            {
                "rank": int(r["rank"]),
                "idle_us": float(r["idle_time(us)"]),
                "compute_us": float(r["compute_time(us)"]),
                "non_compute_us": float(r["non_compute_time(us)"]),
                "kernel_time_us": float(r["kernel_time(us)"]),
            }
            for _, r in tb.iterrows()
        ],
        "kernel_types": {str(r["kernel_type"]): float(r["sum"]) for _, r in ktype.iterrows()},
        "kernels": [
            {
                "rank": int(r["rank"]),
                "name": str(r["name"]),
                "kernel_type": str(r["kernel_type"]),
                "sum_us": float(r["sum (us)"]),
                "mean_us": float(r["mean (us)"]),
                "max_us": float(r["max (us)"]),
                "min_us": float(r["min (us)"]),
            }
            for _, r in kall.iterrows()
        ],
        "comm_comp_overlap_pct": overlap_rows,
    }
    with open(out, "w") as fh:
        json.dump(rec, fh, indent=1, sort_keys=True)


def bench(trace_dir: str) -> None:
    t0 = time.perf_counter()
    ta = _analysis(trace_dir)
    t1 = time.perf_counter()
    tb = ta.get_temporal_breakdown(visualize=False)
    ta.get_gpu_kernel_breakdown(visualize=False)
    t2 = time.perf_counter()
    print(
        json.dumps(
            {
                "load_s": t1 - t0,
                "analysis_s": t2 - t1,
                "total_s": t2 - t0,
                "kernel_time_us": [float(x) for x in tb["kernel_time(us)"]],
            }
        )
    )


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record(sys.argv[2], sys.argv[3:])
    else:
        bench(sys.argv[2])

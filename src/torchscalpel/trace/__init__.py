"""Streaming analysis of torch.profiler (Kineto / Chrome) traces of any size: one code path for
``scalpel analyze`` and ``scalpel profile``.

>>> from torchscalpel.trace import analyze_traces
>>> result = analyze_traces([Path("trace.json.gz")])     # files or folders of rank files
>>> result.to_dict()["ranks"][0]["steps"][0]["gpu_busy_us"]
"""

from __future__ import annotations

from torchscalpel.trace.analyze import TraceAnalysis, analyze_traces, expand_paths
from torchscalpel.trace.categories import CATEGORIES, categorize, kernel_type
from torchscalpel.trace.reader import TraceReader, TraceReadError

__all__ = [
    "CATEGORIES",
    "TraceAnalysis",
    "TraceReadError",
    "TraceReader",
    "analyze_traces",
    "categorize",
    "expand_paths",
    "kernel_type",
]

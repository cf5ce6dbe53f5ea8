"""Which trace files a folder given to ``scalpel analyze`` holds, for the folder kinds users have.

- a torchscalpel **run folder** (``run.json`` beside the trace): the trace its record names;
- a ``scalpel launch --profile`` **launch folder** (``rank-R/run.json``, ``launch.json``): each rank's
  trace (the ``traces/`` copies made for HTA are the same files and are not read twice);
- a **folder of rank traces** (HTA's ``trace_dir`` layout): its ``*.json`` / ``*.json.gz`` files;
- a **TensorBoard log folder**: every ``*.pt.trace.json`` / ``*.pt.trace.json.gz`` under it, at any depth
  (``plugins/profile/<run>/<worker>.pt.trace.json.gz``, or torch's ``tensorboard_trace_handler`` files).
"""

from __future__ import annotations

import json
from pathlib import Path

from torchscalpel.errors import UsageError

TRACE_SUFFIXES = (".json", ".json.gz")
PT_TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
NOT_TRACES = frozenset({"run.json", "launch.json", "manifest.json", "results.json", "summary.json"})
"""JSON files torchscalpel writes beside traces that are not traces."""
RECORD = "run.json"


def record_trace(folder: Path) -> Path | None:
    """The trace a run folder's record names (None when it names none or the file is gone)."""
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = (data.get("profiler") or {}).get("trace") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        return None
    path = folder / name
    return path if path.is_file() else None


def folder_traces(folder: Path) -> list[Path]:
    """The trace files ``folder`` holds (see the module docstring); one sentence when there are none."""
    if (folder / RECORD).is_file():
        trace = record_trace(folder)
        if trace is None:
            raise UsageError(
                f"{folder} is a torchscalpel run folder without a profiler trace; "
                "profile with --profile-steps 1 or more to get one."
            )
        return [trace]
    ranks = sorted(
        (p for p in folder.glob("rank-*") if p.is_dir() and (p / RECORD).is_file()),
        key=lambda p: (int(p.name[5:]) if p.name[5:].isdigit() else 1 << 30, p.name),
    )
    if ranks:
        traces = [t for t in (record_trace(r) for r in ranks) if t is not None]
        if not traces:
            raise UsageError(
                f"{folder} is a launch folder whose ranks wrote no profiler trace; "
                "run 'scalpel launch --profile' to get them."
            )
        return traces
    flat = sorted(
        f
        for f in folder.iterdir()
        if f.is_file() and f.name.endswith(TRACE_SUFFIXES) and f.name not in NOT_TRACES
    )
    if flat:
        return flat
    nested = sorted(f for f in folder.rglob("*") if f.is_file() and f.name.endswith(PT_TRACE_SUFFIXES))
    if nested:
        return nested
    raise UsageError(
        f"{folder} has no .json or .json.gz trace files (nor *.pt.trace.json.gz below it); pass a trace "
        "file, a folder of rank traces, a run or launch folder, or a TensorBoard log folder."
    )

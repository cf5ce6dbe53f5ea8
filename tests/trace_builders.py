"""Small traces and run folders written for the trace tests, shared by tests/unit (read in this process) and
tests/integration (read by ``scalpel analyze`` or by HTA in a process of their own): hostile traces for the
reader's hardening (issue 19, item 12) and a launch folder of two ranks' CPU traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def write_events(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def op_event(i: int, name: str = "aten::mm") -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": 10.0 * i, "dur": 5.0, "pid": 1, "tid": 1}


def deeply_nested_trace(path: Path) -> Path:
    """One good op, then an event whose args nest 200,000 lists deep (json's decoder would recurse)."""
    deep = "[" * 200_000 + "]" * 200_000
    path.write_text(
        '{"traceEvents": ['
        + json.dumps(op_event(0))
        + ', {"ph": "X", "name": "x", "args": {"a": '
        + deep
        + "}}]}"
    )
    return path


def bad_times_trace(tmp_path: Path) -> Path:
    """Four steps of durations 1000, NaN, -5 and 1e308 us, each with one op: six invalid events."""
    events = []
    for i, dur in enumerate([1000.0, float("nan"), -5.0, 1e308]):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{i}",
                "ts": 2000.0 * i,
                "dur": dur,
                "pid": 1,
                "tid": 1,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "ts": 2000.0 * i + 1,
                "dur": 10.0 if i == 0 else dur,
                "pid": 1,
                "tid": 1,
            }
        )
    return write_events(tmp_path / "times.json", events)  # json.dumps writes NaN as the bare literal


def trace_events(rank: int | None = None) -> dict:
    """A small CPU trace: one profiler step, two ops, three memory events."""
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#3",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 40},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 60, "dur": 20},
    ]
    for ts, total in ((12, 4096), (30, 8192), (70, 4096)):
        events.append(
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "s": "t",
                "name": "[memory]",
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "args": {
                    "Total Reserved": 0,
                    "Total Allocated": total,
                    "Bytes": 4096,
                    "Device Type": 0,
                    "Device Id": -1,
                    "Addr": 1,
                },
            }
        )
    data: dict = {"schemaVersion": 1, "traceEvents": events}
    if rank is not None:
        data = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}, **data}
    return data


def write_trace(path: Path, rank: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(trace_events(rank), f)
    return path


def write_run(folder: Path, *, trace: bool = True, rank: int | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if trace:
        write_trace(folder / "trace.json.gz", rank)
    (folder / "run.json").write_text(
        json.dumps(
            {"schema_version": "1.3", "profiler": {"steps": [3], "trace": "trace.json.gz" if trace else None}}
        )
    )
    return folder


def make_launch(tmp_path: Path) -> Path:
    out = tmp_path / "launch"
    write_run(out / "rank-0", rank=0)
    write_run(out / "rank-1")  # no distributedInfo: the copy gets one
    (out / "launch.json").write_text(json.dumps({"ranks": [{"rank": 0}, {"rank": 1}]}, indent=1))
    (out / "logs").mkdir()
    return out

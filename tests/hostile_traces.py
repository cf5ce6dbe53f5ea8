"""Hostile traces for the reader's hardening tests (issue 19, item 12), shared by the in-process checks in
tests/unit/test_trace_hardening.py and the ``scalpel analyze`` runs in tests/integration/test_trace_hardening_cli.py."""

from __future__ import annotations

import json
from pathlib import Path


def write_trace(path: Path, events: list[dict]) -> Path:
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
    return write_trace(tmp_path / "times.json", events)  # json.dumps writes NaN as the bare literal

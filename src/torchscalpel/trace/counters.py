"""Allocator memory as Perfetto / chrome://tracing counter tracks (``"ph": "C"``) in the traces we write.

torch.profiler writes memory as ``[memory]`` instant events, which Perfetto lists but draws no graph
for. :func:`add_memory_counters` adds one counter track per process and device from those events
(``Total Allocated`` and ``Total Reserved`` after each allocation or free), so the trace shows memory
over time beside the ops. The instant events stay: HTA and ``scalpel analyze`` read them.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

MAX_REWRITE_BYTES = 256 << 20
"""Traces larger than this (compressed) are left as they are: the rewrite loads the whole file."""
COUNTER_PREFIX = "Memory"


def memory_counter_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``"ph": "C"`` events, one per ``[memory]`` instant event, named ``Memory (cpu)`` / ``Memory (cuda:0)``."""
    out = []
    for e in events:
        if e.get("name") != "[memory]" or e.get("ph") != "i":
            continue
        args = e.get("args") or {}
        allocated = args.get("Total Allocated")
        if not isinstance(allocated, int | float):
            continue
        kind = args.get("Device Type", 0)
        device = "cpu" if kind == 0 else f"cuda:{args.get('Device Id', 0)}" if kind == 1 else f"device{kind}:{args.get('Device Id', 0)}"
        counter: dict[str, Any] = {"allocated": allocated}
        reserved = args.get("Total Reserved")
        if isinstance(reserved, int | float):
            counter["reserved"] = reserved
        out.append({"ph": "C", "name": f"{COUNTER_PREFIX} ({device})", "cat": "memory", "pid": e.get("pid", 0),
                    "tid": 0, "ts": e.get("ts", 0), "args": counter})
    return out


def add_memory_counters(path: Path) -> int:
    """Add the counter tracks to the trace at ``path`` (``.json`` or ``.json.gz``), atomically; return how
    many counter events were added (0 when there is no memory event, when the trace already has them,
    or when it is larger than :data:`MAX_REWRITE_BYTES`)."""
    path = Path(path)
    if path.stat().st_size > MAX_REWRITE_BYTES:
        return 0
    gz = path.name.endswith(".gz")
    with (gzip.open(path, "rt", encoding="utf-8") if gz else path.open(encoding="utf-8")) as f:
        data = json.load(f)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        return 0
    if any(e.get("ph") == "C" and str(e.get("name", "")).startswith(COUNTER_PREFIX) for e in events if isinstance(e, dict)):
        return 0
    counters = memory_counter_events([e for e in events if isinstance(e, dict)])
    if not counters:
        return 0
    events.extend(counters)
    tmp = path.with_name(path.name + ".tmp")
    # Written with ", " / ": " separators, like torch's own export: HTA finds the rank by '"rank": N'.
    text = json.dumps(data)
    if gz:
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return len(counters)

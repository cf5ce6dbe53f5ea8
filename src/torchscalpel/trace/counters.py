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
import re
from pathlib import Path
from typing import Any

MAX_REWRITE_BYTES = 16 << 20
"""Traces larger than this on disk are left as they are: the rewrite loads the whole file into memory
(16 MiB of gzip is ~150 MiB of JSON, a profiler window of many steps on a large model)."""
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
        device = (
            "cpu"
            if kind == 0
            else f"cuda:{args.get('Device Id', 0)}"
            if kind == 1
            else f"device{kind}:{args.get('Device Id', 0)}"
        )
        counter: dict[str, Any] = {"allocated": allocated}
        reserved = args.get("Total Reserved")
        if isinstance(reserved, int | float):
            counter["reserved"] = reserved
        out.append(
            {
                "ph": "C",
                "name": f"{COUNTER_PREFIX} ({device})",
                "cat": "memory",
                "pid": e.get("pid", 0),
                "tid": 0,
                "ts": e.get("ts", 0),
                "args": counter,
            }
        )
    return out


def add_memory_counters(path: Path) -> int:
    """Add the counter tracks to the trace at ``path`` (``.json`` or ``.json.gz``), atomically; return how
    many counter events were added (0 when there is no memory event, when the trace already has them,
    or when it is larger than :data:`MAX_REWRITE_BYTES`)."""
    path = Path(path)
    if path.stat().st_size > MAX_REWRITE_BYTES:
        return 0
    gz = path.name.endswith(".gz")
    raw = gzip.decompress(path.read_bytes()) if gz else path.read_bytes()
    data = _decode(raw)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        return 0
    events = [e for e in events if isinstance(e, dict)]
    if any(e.get("ph") == "C" and str(e.get("name", "")).startswith(COUNTER_PREFIX) for e in events):
        return 0
    counters = memory_counter_events(events)
    if not counters:
        return 0
    text = _spliced(raw, counters)
    if text is None:  # not torch's layout: write the whole document again
        data["traceEvents"].extend(counters)
        text = json.dumps(data).encode()
    tmp = path.with_name(path.name + ".tmp")
    # Level 6 (zlib's default): half the time of gzip's 9 for a file a few percent larger.
    tmp.write_bytes(gzip.compress(text, compresslevel=6) if gz else text)
    os.replace(tmp, path)
    return len(counters)


def _decode(raw: bytes) -> Any:
    """msgspec when installed (the trace extra; ~2x faster), else the standard library."""
    try:
        import msgspec
    except ImportError:
        return json.loads(raw)
    return msgspec.json.decode(raw)


_TAIL = re.compile(rb'\s*(,\s*"[^"\\]*"\s*:\s*("[^"\\]*"|-?\d+(\.\d+)?)\s*)*}\s*$')
"""What may follow the traceEvents array in torch's export: scalar ``"key": value`` pairs, then ``}``."""


def _spliced(raw: bytes, counters: list[dict[str, Any]]) -> bytes | None:
    """``raw`` with the counters inserted before the closing ``]`` of ``traceEvents``, the rest of the
    bytes untouched (torch's own formatting, which HTA's rank pattern needs); None when the array does
    not end where torch's export ends it."""
    end = len(raw)
    for _ in range(8):  # a ']' inside a trailing string (a traceName path) is skipped
        end = raw.rfind(b"]", 0, end)
        if end < 0:
            return None
        if _TAIL.fullmatch(raw[end + 1 :]):
            break
    else:
        return None
    items = b",\n".join(json.dumps(c).encode() for c in counters)
    return raw[:end].rstrip() + b",\n" + items + b"\n" + raw[end:]

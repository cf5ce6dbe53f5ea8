"""``scalpel fix --verify`` for a memory edit: the patched copy run under ``scalpel memory`` with the
limit the original run crossed must end without crossing it.

The run is the original's (same script arguments, same ``--memory-limit``), with ``--steps all`` as the
original had under a limit: the fix must hold for the whole run, not for a window. Its peak is read from
its own record, beside the peak the original crossed the limit with.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from torchscalpel.record import RunRecord

RUN_TIMEOUT_S = 600
"""The re-run is stopped after this long (a script that trains for hours fits or crosses early)."""


@dataclass(frozen=True, slots=True)
class MemoryVerdict:
    """What the patched copy did under the limit."""

    fits: bool
    line: str


def verify_memory(record: RunRecord, script: Path, patched: Path, work: Path) -> MemoryVerdict:
    """Run ``scalpel memory --memory-limit LIMIT`` on the patched copy of ``script`` (in folder ``patched``)."""
    import json

    from torchscalpel.fix.memory_plan import memory_oom
    from torchscalpel.units import fmt_bytes

    oom = memory_oom(record) or {}
    limit = int(oom.get("limit") or 0)
    if not limit:
        return MemoryVerdict(False, "memory under the limit: not measured: the memory run recorded no limit")
    out = work / "memory"
    args = [str(a) for a in (record.target or {}).get("args") or []]
    cmd = [sys.executable, "-m", "torchscalpel", "memory", "--memory-limit", str(limit), "--steps", "all"]
    cmd += ["--no-report", "--no-plan", "--out", str(out), "--", script.name, *args]
    with (work / "memory.log").open("w", encoding="utf-8") as log:
        try:
            subprocess.run(
                cmd, cwd=patched, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            pass
    try:
        data = json.loads((out / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return MemoryVerdict(
            False,
            f"memory under the limit: not measured: the re-run wrote no record (see {work / 'memory.log'})",
        )
    section = (data.get("sections") or {}).get("memory") or {}
    before = fmt_bytes(int(oom.get("live") or 0))
    if section.get("oom"):
        live = int((section["oom"] or {}).get("live") or 0)
        return MemoryVerdict(
            False,
            f"memory: the patched script still crossed the limit of {fmt_bytes(limit)} ({fmt_bytes(live)} live; original {before})",
        )
    if data.get("status") not in ("complete", "stopped"):
        return MemoryVerdict(
            False,
            f"memory: the patched script ended {data.get('status')} under scalpel memory ({data.get('error')})",
        )
    peak = int(((section.get("peak") or {}).get("total")) or 0)
    return MemoryVerdict(
        True,
        f"memory: peak {fmt_bytes(peak)} under the limit of {fmt_bytes(limit)} for the whole run "
        f"({len(data.get('steps') or [])} steps; the original crossed it with {before} live)",
    )

"""The trace folder layout HTA reads: ``TraceAnalysis(trace_dir=OUT/traces)`` on a ``scalpel launch --profile`` folder.

HTA's contract (``hta.common.trace_file``): every ``*.json`` / ``*.gz`` file directly in ``trace_dir`` is
a trace, and each names its rank as ``"distributedInfo": {"rank": N, ...}`` (found by the text
``"rank": N``); a file without one is taken as rank 0. A launch folder holds ``launch.json`` and the
per-rank run folders, so :func:`write_rank_traces` puts one ``rank-R.pt.trace.json.gz`` per rank, and
nothing else, into ``OUT/traces/``, adding ``distributedInfo`` to a trace that lacks it.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

from torchscalpel.trace.folders import RECORD, record_trace

TRACES_DIR = "traces"
_RANK_TEXT = re.compile(rb'"rank":\s+(\d+)')
"""HTA's own rank pattern (a space after the colon is required)."""
HEAD_BYTES = 1 << 20


def trace_rank(path: Path) -> int | None:
    """The rank HTA would read from the trace's first MiB, None when it finds none."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    m = _RANK_TEXT.search(head)
    return int(m.group(1)) if m else None


def write_rank_trace(source: Path, dest: Path, rank: int, world_size: int) -> None:
    """Copy ``source`` to ``dest`` (gzipped); when it names no rank, add ``distributedInfo`` after its first ``{``."""
    opener = gzip.open if source.name.endswith(".gz") else open
    found = trace_rank(source)
    tmp = dest.with_name(dest.name + ".tmp")
    with opener(source, "rb") as src, gzip.open(tmp, "wb") as out:
        if found is None:
            head = src.read(HEAD_BYTES)
            brace = head.index(b"{")
            info = json.dumps({"backend": "unknown", "rank": rank, "world_size": world_size}).encode()
            out.write(head[: brace + 1] + b'\n  "distributedInfo": ' + info + b"," + head[brace + 1 :])
        shutil.copyfileobj(src, out)
    tmp.replace(dest)


def write_rank_traces(launch_dir: Path) -> list[Path]:
    """``launch_dir/traces/rank-R.pt.trace.json.gz`` for every ``rank-R/`` run folder with a trace."""
    ranks = {}
    for folder in launch_dir.glob("rank-*"):
        suffix = folder.name[5:]
        if suffix.isdigit() and (folder / RECORD).is_file():
            trace = record_trace(folder)
            if trace is not None:
                ranks[int(suffix)] = trace
    if not ranks:
        return []
    out_dir = launch_dir / TRACES_DIR
    out_dir.mkdir(exist_ok=True)
    written = []
    for rank, trace in sorted(ranks.items()):
        dest = out_dir / f"rank-{rank}.pt.trace.json.gz"
        write_rank_trace(trace, dest, rank, len(ranks))
        written.append(dest)
    return written

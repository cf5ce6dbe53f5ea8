"""``analyze_traces``: the front door of the trace package (files or folders of rank files in, one result out)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchscalpel.errors import UsageError
from torchscalpel.trace.categories import categorize
from torchscalpel.trace.collect import RankCollector, RankData
from torchscalpel.trace.folders import (
    TRACE_SUFFIXES as TRACE_SUFFIXES,  # re-exported: readers imported it here
)
from torchscalpel.trace.folders import folder_traces
from torchscalpel.trace.gpu import gpu_summary, launch_stats, launch_times
from torchscalpel.trace.memory import memory_summary
from torchscalpel.trace.ops import aggregate_ops, category_totals, op_self_times, top_table
from torchscalpel.trace.ranks import stragglers
from torchscalpel.trace.reader import TraceReader, TraceReadError
from torchscalpel.trace.steps import step_breakdown

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass
class TraceAnalysis:
    """The result of :func:`analyze_traces`; :meth:`to_dict` is the JSON form used everywhere."""

    ranks: list[dict[str, Any]]
    top_ops: list[dict[str, Any]]
    top_kernels: list[dict[str, Any]]
    categories: dict[str, float]
    gpu_categories: dict[str, float]
    memory: dict[str, Any] | None
    stragglers: dict[str, Any] | None
    errors: list[dict[str, Any]] = field(default_factory=list)
    # name -> [count, self_us, total_us], all ops / kernels (not cut to top N): what --diff compares
    op_table: dict[str, list[float]] = field(default_factory=dict, repr=False)
    kernel_table: dict[str, list[float]] = field(default_factory=dict, repr=False)

    @property
    def complete(self) -> bool:
        """False when a file was truncated or corrupt (the figures cover what could be read)."""
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return {
            "schema": "torchscalpel.trace/1",
            "ranks": self.ranks,
            "top_ops": self.top_ops,
            "top_kernels": self.top_kernels,
            "categories": self.categories,
            "gpu_categories": self.gpu_categories,
            "memory": self.memory,
            "stragglers": self.stragglers,
            "errors": self.errors,
            "complete": self.complete,
            "op_table": self.op_table,
            "kernel_table": self.kernel_table,
        }


def expand_paths(paths: list[Path]) -> list[Path]:
    """Files as given, folders replaced by the traces they hold (:func:`~torchscalpel.trace.folders.folder_traces`:
    run folder, launch folder, folder of rank traces, TensorBoard log folder), sorted by rank."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(folder_traces(p), key=_rank_sort_key))
        elif p.is_file():
            out.append(p)
        elif p.exists():  # /dev/zero, a pipe, a socket: reading one would never end or mean nothing
            raise UsageError(
                f"Trace {p} is not a regular file (a device, pipe or socket); give a trace file or a folder of traces."
            )
        else:
            raise UsageError(f"Trace {p} does not exist; check the path.")
    return out


def _rank_sort_key(p: Path) -> tuple[int, str]:
    m = _RANK_IN_NAME.search(p.name)
    return (int(m.group(1)) if m else 1 << 30, p.name)


def _rank_of(meta: dict[str, Any], path: Path, index: int) -> int:
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else index


def _device(meta: dict[str, Any], d: RankData) -> str:
    props = meta.get("deviceProperties")
    names = (
        " ".join(str(p.get("name", "")) for p in props if isinstance(p, dict))
        if isinstance(props, list)
        else ""
    )
    if re.search(r"AMD|Radeon|Instinct|MI\d", names) or "roctracer" in str(meta.get("traceName", "")):
        return "rocm"
    return "gpu" if (d.gpu_kind != 3).any() else "cpu"


def analyze_file(
    path: Path, index: int = 0, *, strict: bool = False, hta_rounding: bool = False
) -> tuple[dict[str, Any], RankData, Any]:
    """Stream one trace file; returns the rank summary, its columns and the CPU op self times."""
    reader = TraceReader(path)
    collector = RankCollector()
    error: TraceReadError | None = None
    try:
        for batch in reader.batches():
            collector.feed(batch)
    except TraceReadError as exc:
        if strict:
            raise
        error = exc
    d = collector.finish()
    launch = launch_times(d)
    op_self = op_self_times(d)
    rank: dict[str, Any] = {
        "rank": _rank_of(reader.meta, path, index),
        "path": str(path),
        "device": _device(reader.meta, d),
        "events": reader.events_read,
        "invalid_events": d.invalid_events,
        "json_bytes": reader.bytes_read,
        "complete": error is None,
        "error": None
        if error is None
        else {"message": str(error), "byte_offset": error.offset, "reason": error.reason},
        "steps": step_breakdown(d, launch, op_self),
        "gpu": gpu_summary(d, launch, hta_rounding=hta_rounding),
        "launch": launch_stats(d, launch),
        "memory": memory_summary(d),
    }
    return rank, d, op_self


def analyze_traces(
    paths: list[Path] | Path,
    *,
    top: int = 30,
    strict: bool = False,
    hta_rounding: bool = False,
    progress: Callable[[int, int, Path], None] | None = None,
) -> TraceAnalysis:
    """Analyse trace files (or folders of rank files) in one streaming pass each.

    A truncated or corrupt file does not stop the analysis: its rank covers what could be read and
    the error (with the byte offset) is in ``errors``; ``strict=True`` raises it instead. ``progress``
    hears ``(index, count, path)`` before each file is read.
    """
    if isinstance(paths, str | Path):
        paths = [Path(paths)]
    files = expand_paths(list(paths))
    ranks: list[dict[str, Any]] = []
    ops: dict[str, list[float]] = {}
    kernels: dict[str, list[float]] = {}
    errors: list[dict[str, Any]] = []
    for i, f in enumerate(files):
        if progress is not None:
            progress(i, len(files), f)
        rank, d, op_self = analyze_file(f, i, strict=strict, hta_rounding=hta_rounding)
        ranks.append(rank)
        if rank["error"]:
            errors.append({"path": str(f), **rank["error"]})
        for nid, (c, s, t) in aggregate_ops(d, op_self).items():
            acc = ops.setdefault(d.names[nid], [0.0, 0.0, 0.0])
            acc[0] += c
            acc[1] += s
            acc[2] += t
        _add_kernels(d, kernels)
    top_kernels = [
        {
            "name": n,
            "category": categorize(n),
            "count": int(v[0]),
            "self_us": v[1],
            "total_us": v[2],
            "mean_us": v[2] / v[0] if v[0] else 0.0,
        }
        for n, v in sorted(kernels.items(), key=lambda kv: -kv[1][2])
    ]
    mems = [r["memory"] for r in ranks if r["memory"]]
    memory = dict(max(mems, key=lambda m: m["peak_bytes"])) if mems else None
    if memory is not None and len(ranks) > 1:
        memory["rank"] = next(
            r["rank"] for r in ranks if r["memory"] and r["memory"]["peak_bytes"] == memory["peak_bytes"]
        )
    gpu_cats: dict[str, float] = {}
    for n, v in kernels.items():
        cat = categorize(n)
        gpu_cats[cat] = gpu_cats.get(cat, 0.0) + v[2]
    return TraceAnalysis(
        ranks=ranks,
        top_ops=top_table(ops, top),
        top_kernels=top_kernels[:top] if top else top_kernels,
        categories=category_totals(ops),
        gpu_categories=dict(sorted(gpu_cats.items(), key=lambda kv: -kv[1])),
        memory=memory,
        stragglers=stragglers(ranks),
        errors=errors,
        op_table=ops,
        kernel_table=kernels,
    )


def _add_kernels(d: RankData, acc: dict[str, list[float]]) -> None:
    """Whole-trace kernel totals (every GPU activity, not only HTA's window) by name."""
    work = d.gpu_kind != 3
    if not work.any():
        return
    uniq, inv = np.unique(d.gpu_name[work], return_inverse=True)
    count = np.bincount(inv)
    total = np.bincount(inv, weights=d.gpu_dur[work])
    for u, c, t in zip(uniq, count, total, strict=True):
        row = acc.setdefault(d.names[int(u)], [0.0, 0.0, 0.0])
        row[0] += float(c)
        row[1] += float(t)
        row[2] += float(t)

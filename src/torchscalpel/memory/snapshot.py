"""Read a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``) safely, and explain it.

A snapshot is a pickle, and a pickle can run code. :class:`PlainUnpickler` builds only what the pickle
opcodes build by themselves (dicts, lists, tuples, strings, bytes, numbers, booleans, None): every
global lookup (``find_class``) and persistent id is refused, so nothing is imported or called. A file
that needs one is not a plain snapshot and gets one sentence and exit 2.

The explanation, from the ``segments`` part: reserved and allocated bytes, memory free inside reserved
segments (fragmentation) and the largest free block, the allocations by the user's call site (the first
Python frame outside torch), the largest blocks; from ``device_traces``: the out-of-memory events (the
request that failed) when the snapshot recorded history.
"""

from __future__ import annotations

import io
import pickle
import time
from pathlib import Path
from typing import Any

from torchscalpel.errors import UsageError
from torchscalpel.units import fmt_bytes

_LIB_MARKERS = ("/torch/", "site-packages", "dist-packages", "/lib/python", "<frozen", "??")


class Refused(pickle.UnpicklingError):
    """The pickle asked for a global or a persistent id."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that refuses every class, function and persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        raise Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise Refused("a persistent id")


def load_snapshot(path: Path) -> dict[str, Any]:
    """The snapshot as plain data; :class:`UsageError` (exit 2) with one sentence for anything else."""
    try:
        with path.open("rb") as fh:
            data = PlainUnpickler(io.BufferedReader(fh, buffer_size=1 << 20)).load()
    except Refused as exc:
        raise UsageError(f"{path} is not a plain PyTorch memory snapshot: it asks to build {exc}, which this "
                         "reader refuses (only containers and numbers are allowed).") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, OverflowError, MemoryError, AttributeError) as exc:
        raise UsageError(f"{path} is not a PyTorch memory snapshot ({type(exc).__name__} while reading it as a "
                         "pickle); give a file written by torch.cuda.memory._dump_snapshot.") from None
    except OSError as exc:
        raise UsageError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise UsageError(f"{path} is a pickle but not a PyTorch memory snapshot (no 'segments' list); give a file "
                         "written by torch.cuda.memory._dump_snapshot.")
    return data


def _is_user_file(fn: str, cache: dict[str, bool]) -> bool:
    user = cache.get(fn)
    if user is None:
        user = cache[fn] = fn.endswith(".py") and not any(m in fn for m in _LIB_MARKERS)
    return user


def user_site(frames: Any, cache: dict[str, bool] | None = None) -> str:
    """The innermost frame outside torch and the standard library, as ``file:line``."""
    if not isinstance(frames, list):
        return "(no frames)"
    cache = {} if cache is None else cache
    fallback = None
    for f in frames:
        if not isinstance(f, dict):
            continue
        fn = f.get("filename", "")
        if not isinstance(fn, str):
            continue
        if _is_user_file(fn, cache):
            return f"{fn}:{f.get('line')}"
        if fallback is None and fn.endswith(".py"):
            fallback = f"{fn}:{f.get('line')}"
    return fallback or "(no Python frame)"


def explain(data: dict[str, Any]) -> dict[str, Any]:
    """Totals, fragmentation, sites and out-of-memory events of a loaded snapshot (plain JSON)."""
    reserved = allocated = requested = free = largest_free = blocks = 0
    files: dict[str, bool] = {}
    by_site: dict[str, int] = {}
    largest: list[tuple[int, str]] = []
    for seg in data["segments"]:
        if not isinstance(seg, dict):
            continue
        reserved += int(seg.get("total_size", 0) or 0)
        for b in seg.get("blocks", ()) or ():
            size = int(b.get("size", 0) or 0)
            if b.get("state") == "active_allocated":
                blocks += 1
                allocated += size
                requested += int(b.get("requested_size", size) or size)
                site = user_site(b.get("frames"), files)
                by_site[site] = by_site.get(site, 0) + size
                if len(largest) < 10 or size > largest[-1][0]:
                    largest.append((size, site))
                    largest.sort(key=lambda t: t[0], reverse=True)
                    del largest[10:]
            elif b.get("state") == "inactive":
                free += size
                largest_free = max(largest_free, size)
    ooms = []
    for device, trace in enumerate(data.get("device_traces", []) or []):
        for e in trace or ():
            if isinstance(e, dict) and e.get("action") == "oom":
                ooms.append({"device": device, "bytes": e.get("size"), "site": user_site(e.get("frames"), files),
                             "device_free": e.get("device_free")})
    share = free / reserved if reserved else 0.0
    sites = sorted(by_site.items(), key=lambda kv: kv[1], reverse=True)[:10]
    return {
        "segments": len(data["segments"]), "blocks": blocks, "reserved": reserved, "allocated": allocated,
        "requested": requested, "reserved_free": free, "fragmentation_share": share, "largest_free": largest_free,
        "sites": [{"name": s, "bytes": v} for s, v in sites],
        "largest": [{"bytes": n, "site": s} for n, s in largest], "ooms": ooms[-5:],
        "expandable_segments_advised": share > 0.2,
    }


def explain_snapshot(path: Path) -> dict[str, Any]:
    """Load (safely) and explain ``path``; ``read_s`` is the wall time both took."""
    t0 = time.perf_counter()
    result = explain(load_snapshot(path))
    result["read_s"] = time.perf_counter() - t0
    result["path"] = str(path)
    return result


def render_snapshot(r: dict[str, Any]) -> list[str]:
    """Terminal lines for :func:`explain_snapshot`'s result."""
    lines = [f"snapshot {r['path']}: {r['segments']} segments, {r['blocks']} live blocks",
             f"  reserved {fmt_bytes(r['reserved'])}, allocated {fmt_bytes(r['allocated'])}, free inside reserved "
             f"{fmt_bytes(r['reserved_free'])} ({r['fragmentation_share']:.0%}), largest free block "
             f"{fmt_bytes(r['largest_free'])}"]
    for o in r["ooms"]:
        lines.append(f"  out of memory: asked for {fmt_bytes(o['bytes'])} at {o['site']}")
    if r["sites"]:
        lines.append("allocated by call site:")
        lines += [f"  {s['name']:<60} {fmt_bytes(s['bytes']):>11}" for s in r["sites"][:8]]
    if r["expandable_segments_advised"]:
        lines.append("fix: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (more than 20% of reserved memory is "
                     "free but fragmented)")
    return lines

"""Read a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``) safely, and explain it.

A snapshot is a pickle, and a pickle can run code. Both readers here build only what the pickle opcodes
build by themselves (dicts, lists, tuples, sets, strings, bytes, numbers, booleans, None):

- the native reader (``snapshot_scan.c`` through ``snapshot_native``, compiled on first use) refuses
  every opcode that imports, calls or builds an object before anything is built, then evaluates the
  pickle in C and builds the explanation there: each segment is summarized and freed as soon as it is
  complete, so a 1 GB snapshot needs a small fraction of 1 GB of RAM and no Python object per block;
- the pure-Python reader (:class:`PlainUnpickler`, every global lookup and persistent id refused) reads
  the whole file at once; it runs when no C compiler is available, with ``TORCHSCALPEL_NATIVE=0``, or
  for a pickle that mixes the two memo styles. The output names the reader.

A file that needs anything else is not a plain snapshot and gets one sentence and exit 2. Both readers
give the same explanation, by the same rules (:class:`SnapshotSummary` here, its C twin in
``snapshot_scan.c``; a test compares them): from ``segments``, reserved and allocated bytes, memory free
inside reserved segments (fragmentation) and the largest free block, the allocations by the user's call
site (the innermost ``.py`` frame :mod:`torchscalpel.runtime.userframes` calls the user's), the largest
blocks; from ``device_traces``, the live bytes over the recorded trace (its peak) and the out-of-memory
events (the request that failed) when the snapshot recorded history.
"""

from __future__ import annotations

import gc
import io
import pickle
import time
from pathlib import Path
from typing import Any

from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.memory import snapshot_native as native
from torchscalpel.plaindata import PlainUnpickler, Refused
from torchscalpel.runtime.userframes import is_user_file
from torchscalpel.units import fmt_bytes

_WHAT = {  # why each refused opcode is refused, for the one sentence
    "GLOBAL": "imports a class or function", "STACK_GLOBAL": "imports a class or function",
    "INST": "imports and calls a class", "OBJ": "calls a class", "REDUCE": "calls a function",
    "NEWOBJ": "calls a class", "NEWOBJ_EX": "calls a class", "BUILD": "sets an object's state",
    "PERSID": "needs a persistent id", "BINPERSID": "needs a persistent id",
    "EXT1": "names a registered class", "EXT2": "names a registered class", "EXT4": "names a registered class",
    "NEXT_BUFFER": "needs an out-of-band buffer", "READONLY_BUFFER": "needs an out-of-band buffer",
}


def _not_snapshot(path: Path, why: str) -> UsageError:
    return UsageError(f"{path} is not a PyTorch memory snapshot ({why}); give a file written by "
                      "torch.cuda.memory._dump_snapshot.")


def _truncated(path: Path, where: str) -> UsageError:
    return UsageError(f"{path} is cut short ({where}): the snapshot was not written completely; dump it again.")


def load_snapshot(path: Path) -> dict[str, Any]:
    """The whole snapshot as plain data (pure-Python reader); :class:`UsageError` (exit 2) for anything else."""
    try:
        with path.open("rb") as fh:
            data = PlainUnpickler(io.BufferedReader(fh, buffer_size=1 << 20)).load()
    except Refused as exc:
        raise UsageError(f"{path} is not a plain PyTorch memory snapshot: it asks to build {exc}, which this "
                         "reader refuses (only containers and numbers are allowed).") from None
    except EOFError:
        raise _truncated(path, "it ends before the pickle's STOP opcode") from None
    except pickle.UnpicklingError as exc:
        if "truncated" in str(exc):
            raise _truncated(path, "it ends inside an opcode") from None
        raise _not_snapshot(path, f"{type(exc).__name__} while reading it as a pickle") from None
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, AttributeError) as exc:
        raise _not_snapshot(path, f"{type(exc).__name__} while reading it as a pickle") from None
    except MemoryError:
        raise ScalpelError(f"{path} does not fit in memory with the pure-Python reader; install a C compiler "
                           "(gcc) so the streaming reader can run.") from None
    except OSError as exc:
        raise UsageError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise _not_snapshot(path, "a pickle, but with no 'segments' list")
    return data


def _is_user_file(fn: str, cache: dict[str, bool]) -> bool:
    user = cache.get(fn)
    if user is None:
        user = cache[fn] = fn.endswith(".py") and is_user_file(fn)
    return user


def user_site(frames: Any, cache: dict[str, bool] | None = None) -> str:
    """The innermost frame of the user's code (:mod:`torchscalpel.runtime.userframes`, ``.py`` files only), else
    the innermost ``.py`` frame, as ``file:line``.

    Not ``userframes.first_user`` itself: this runs per block of a large snapshot with its own per-name
    cache, and must give the C reader's answers (which asks the same ``is_user_file`` once per name)."""
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


def _int(v: Any) -> int:
    return v if type(v) is int else int(v or 0) if isinstance(v, int | float) else 0


class SnapshotSummary:
    """The explanation, built one segment and one trace event at a time (both readers feed it)."""

    def __init__(self) -> None:
        self.segments = self.blocks = self.reserved = self.allocated = self.requested = 0
        self.free = self.largest_free = 0
        self.files: dict[str, bool] = {}
        self.by_site: dict[str, int] = {}
        self.largest: list[tuple[int, str]] = []
        self.ooms: list[dict[str, Any]] = []
        self.trace_events = self.live = self.trace_peak = 0
        self.trace_peak_at = -1
        # site of a traceback, keyed by the ids of its frame dicts: torch shares one dict per distinct frame,
        # so a new list of old frames hits. The entry holds the list, so no id in a key can be reused while
        # it is cached; cleared when full, which bounds what it pins (every frame new: no hits, little kept).
        self.tb_sites: dict[tuple[int, ...], tuple[list[Any], str]] = {}

    def segment(self, seg: Any) -> None:
        """One element of ``segments``."""
        self.segments += 1
        if not isinstance(seg, dict):
            return
        self.reserved += _int(seg.get("total_size"))
        blocks = seg.get("blocks")
        if not isinstance(blocks, list):
            return
        # the hot loop (millions of blocks in a large snapshot): locals, and the int check inlined
        by_site, largest, site_of = self.by_site, self.largest, self._site
        n = allocated = requested = free = 0
        largest_free = self.largest_free
        for b in blocks:
            if type(b) is not dict:
                continue
            state = b.get("state")
            size = b.get("size")
            if type(size) is not int:
                size = _int(size)
            if state == "active_allocated":
                n += 1
                allocated += size
                req = b.get("requested_size", size)
                requested += req if type(req) is int else _int(req)
                site = site_of(b.get("frames"))
                by_site[site] = by_site.get(site, 0) + size
                if size > largest[-1][0] if len(largest) >= 10 else True:
                    largest.append((size, site))
                    largest.sort(key=lambda t: t[0], reverse=True)
                    del largest[10:]
            elif state == "inactive":
                free += size
                if size > largest_free:
                    largest_free = size
        self.blocks += n
        self.allocated += allocated
        self.requested += requested
        self.free += free
        self.largest_free = largest_free

    def _site(self, frames: Any) -> str:
        if type(frames) is not list:
            return user_site(frames, self.files)
        key = tuple(map(id, frames))
        hit = self.tb_sites.get(key)
        if hit is not None:
            return hit[1]
        site = user_site(frames, self.files)
        if len(self.tb_sites) >= 20_000:
            self.tb_sites.clear()
        self.tb_sites[key] = (frames, site)
        return site

    def trace_event(self, device: int, e: Any) -> None:
        """One element of ``device_traces[device]``: live bytes over the trace, and the OOM events."""
        if not isinstance(e, dict):
            return
        self.trace_events += 1
        action = e.get("action")
        if action == "alloc":
            self.live += _int(e.get("size"))
            if self.live > self.trace_peak:
                self.trace_peak, self.trace_peak_at = self.live, self.trace_events - 1
        elif action == "free_completed":
            self.live -= _int(e.get("size"))
        elif action == "oom":
            self.ooms.append({"device": device, "bytes": e.get("size"), "site": self._site(e.get("frames")),
                              "device_free": e.get("device_free")})
            del self.ooms[:-5]

    def fields(self) -> dict[str, Any]:
        """What :func:`explanation` needs, as the native reader returns it too."""
        sites = sorted(self.by_site.items(), key=lambda kv: kv[1], reverse=True)[:10]
        return {"segments": self.segments, "blocks": self.blocks, "reserved": self.reserved,
                "allocated": self.allocated, "requested": self.requested, "free": self.free,
                "largest_free": self.largest_free, "trace_events": self.trace_events, "live": self.live,
                "trace_peak": self.trace_peak, "trace_peak_at": self.trace_peak_at, "sites": sites,
                "largest": list(self.largest), "ooms": list(self.ooms)}

    def result(self) -> dict[str, Any]:
        """Plain JSON."""
        return explanation(self.fields())


def explanation(f: dict[str, Any]) -> dict[str, Any]:
    """The explanation (plain JSON) from a summary's fields, whichever reader built them."""
    share = f["free"] / f["reserved"] if f["reserved"] else 0.0
    return {
        "segments": f["segments"], "blocks": f["blocks"], "reserved": f["reserved"], "allocated": f["allocated"],
        "requested": f["requested"], "reserved_free": f["free"], "fragmentation_share": share,
        "largest_free": f["largest_free"], "sites": [{"name": s, "bytes": v} for s, v in f["sites"]],
        "largest": [{"bytes": n, "site": s} for n, s in f["largest"]], "ooms": f["ooms"],
        "trace": {"events": f["trace_events"], "peak_live": f["trace_peak"], "peak_at_event": f["trace_peak_at"]},
        "expandable_segments_advised": share > 0.2,
    }


def explain(data: dict[str, Any]) -> dict[str, Any]:
    """Totals, fragmentation, sites, trace peak and out-of-memory events of a loaded snapshot (plain JSON)."""
    summary = SnapshotSummary()
    for seg in data["segments"]:
        summary.segment(seg)
    traces = data.get("device_traces")
    for device, trace in enumerate(traces if isinstance(traces, list) else ()):
        if isinstance(trace, list):
            for e in trace:
                summary.trace_event(device, e)
    return summary.result()


def _native_error(path: Path, err: native.ScanError) -> ScalpelError:
    if err.code == native.E_REFUSED:
        what = _WHAT.get(err.message, "is not plain data")
        return UsageError(f"{path} is not a plain PyTorch memory snapshot: at byte {err.offset} it {what} "
                          f"(pickle opcode {err.message}), which this reader refuses (only containers and "
                          "numbers are allowed).")
    if err.code == native.E_TRUNCATED:
        return _truncated(path, f"{err.message}, at byte {err.offset}")
    if err.code == native.E_IO:
        return UsageError(f"Cannot read {path}: {err.message}.")
    if err.code == native.E_NOMEM:
        return ScalpelError(f"Reading {path} ran out of memory in the native reader.")
    return _not_snapshot(path, f"{err.message}, at byte {err.offset}")


def _read_native(path: Path, lib: Any, progress: native.Progress | None) -> tuple[dict[str, Any], dict[str, int]]:
    try:
        fields, stats = native.summarize(lib, path, is_user_file, progress)
    except native.ScanError as err:
        if err.code == native.E_NOSEG:
            raise _not_snapshot(path, "a pickle, but with no 'segments' list") from None
        raise
    return explanation(fields), stats


def read_snapshot(path: Path, progress: native.Progress | None = None) -> dict[str, Any]:
    """Explain ``path`` with the native reader, or the pure-Python one when it cannot run.

    ``reader`` says which ran ("native" or "python") and ``reader_note`` why the native one did not;
    ``progress(done, total)`` is called between slices of the native reader's two passes.
    """
    lib, why = native.load_library()
    if lib is not None:
        try:
            result, stats = _read_native(path, lib, progress)
            result.update(reader="native", reader_note="", scanner=stats)
            return result
        except native.ScanError as err:
            if err.code != native.E_SHAPE:
                raise _native_error(path, err) from None
            why = f"the native reader does not handle this layout ({err.message})"
    gc_was = gc.isenabled()
    gc.disable()  # the whole-file reader makes millions of acyclic containers; collections would only cost time
    try:
        result = explain(load_snapshot(path))
    finally:
        if gc_was:
            gc.enable()
    result.update(reader="python", reader_note=why)
    return result


def explain_snapshot(path: Path, progress: native.Progress | None = None) -> dict[str, Any]:
    """Load (safely) and explain ``path``; ``read_s`` is the wall time both took."""
    t0 = time.perf_counter()
    result = read_snapshot(path, progress)
    result["read_s"] = time.perf_counter() - t0
    result["path"] = str(path)
    return result


def render_snapshot(r: dict[str, Any]) -> list[str]:
    """Terminal lines for :func:`explain_snapshot`'s result."""
    lines = [f"snapshot {r['path']}: {r['segments']} segments, {r['blocks']} live blocks",
             f"  reserved {fmt_bytes(r['reserved'])}, allocated {fmt_bytes(r['allocated'])}, free inside reserved "
             f"{fmt_bytes(r['reserved_free'])} ({r['fragmentation_share']:.0%}), largest free block "
             f"{fmt_bytes(r['largest_free'])}"]
    trace = r.get("trace") or {}
    if trace.get("events"):
        lines.append(f"  trace: {trace['events']} allocator events, live bytes peaked {fmt_bytes(trace['peak_live'])} "
                     f"above the trace's start (event {trace['peak_at_event']})")
    for o in r["ooms"]:
        lines.append(f"  out of memory: asked for {fmt_bytes(o['bytes'])} at {o['site']}")
    if r["sites"]:
        lines.append("allocated by call site:")
        lines += [f"  {s['name']:<60} {fmt_bytes(s['bytes']):>11}" for s in r["sites"][:8]]
    if r["expandable_segments_advised"]:
        lines.append("fix: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (more than 20% of reserved memory is "
                     "free but fragmented)")
    if r.get("reader") == "python":
        lines.append(f"(read whole by the pure-Python reader: {r.get('reader_note') or 'native reader unavailable'})")
    elif r.get("reader") == "native":
        lines.append("(read by the native streaming reader)")
    return lines

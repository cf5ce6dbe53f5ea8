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
site (the innermost ``.py`` frame :mod:`torchscalpel.runtime.userframes` calls the user's; what each frame
is, by :mod:`~torchscalpel.memory.snapshot_frames`), the largest
blocks; from ``device_traces``, the live bytes over the recorded trace (its peak, and a timeline of allocated and,
from segment events, reserved bytes kept in :data:`TIMELINE_POINTS` points) and the out-of-memory
events (the request that failed) when the snapshot recorded history.

A pickle's memo lets a file name one object many times for two bytes each: a 0.4 MB file can list one
segment of 10^5 blocks 10^5 times. Both readers therefore count what they walk (segments, blocks, trace
events, frames) and refuse a file once that exceeds :func:`snapshot_native.work_budget` of its size, which a
file torch wrote never nears (each block, event and frame reference costs it bytes of its own).
"""

from __future__ import annotations

import gc
import io
import pickle
import time
import traceback
from pathlib import Path
from typing import Any

from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.memory import snapshot_native as native
from torchscalpel.memory.snapshot_frames import INT64_LIMIT, PHASES, frame_code, traceback_facts
from torchscalpel.plaindata import PlainUnpickler, Refused, SignalCheckingReader, TooMuchWork, WorkCounter

_WHAT = {  # why each refused opcode is refused, for the one sentence
    "GLOBAL": "imports a class or function",
    "STACK_GLOBAL": "imports a class or function",
    "INST": "imports and calls a class",
    "OBJ": "calls a class",
    "REDUCE": "calls a function",
    "NEWOBJ": "calls a class",
    "NEWOBJ_EX": "calls a class",
    "BUILD": "sets an object's state",
    "PERSID": "needs a persistent id",
    "BINPERSID": "needs a persistent id",
    "EXT1": "names a registered class",
    "EXT2": "names a registered class",
    "EXT4": "names a registered class",
    "NEXT_BUFFER": "needs an out-of-band buffer",
    "READONLY_BUFFER": "needs an out-of-band buffer",
}


def _not_snapshot(path: Path, why: str) -> UsageError:
    return UsageError(
        f"{path} is not a PyTorch memory snapshot ({why}); give a file written by "
        "torch.cuda.memory._dump_snapshot."
    )


def _truncated(path: Path, where: str) -> UsageError:
    return UsageError(
        f"{path} is cut short ({where}): the snapshot was not written completely; dump it again."
    )


def load_snapshot(path: Path) -> dict[str, Any]:
    """The whole snapshot as plain data (pure-Python reader); :class:`UsageError` (exit 2) for anything else."""
    try:
        with io.FileIO(path) as raw, io.BufferedReader(raw, buffer_size=1 << 20) as fh:
            # through Python reads: Ctrl-C raises within one 64 KiB frame (the C loop alone never looks, and a
            # BufferedReader wrapped round the file's own dropped the interrupt: the read went on to exit 0)
            data = PlainUnpickler(SignalCheckingReader(fh)).load()
    except Refused as exc:
        raise UsageError(
            f"{path} is not a plain PyTorch memory snapshot: it asks to build {exc}, which this "
            "reader refuses (only containers and numbers are allowed)."
        ) from None
    except EOFError:
        raise _truncated(path, "it ends before the pickle's STOP opcode") from None
    except pickle.UnpicklingError as exc:
        if "truncated" in str(exc):
            raise _truncated(path, "it ends inside an opcode") from None
        raise _not_snapshot(path, f"{type(exc).__name__} while reading it as a pickle") from None
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, AttributeError) as exc:
        raise _not_snapshot(path, f"{type(exc).__name__} while reading it as a pickle") from None
    except MemoryError:
        raise ScalpelError(
            f"{path} does not fit in memory with the pure-Python reader; install a C compiler "
            "(gcc) so the streaming reader can run."
        ) from None
    except OSError as exc:
        raise UsageError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise _not_snapshot(path, "a pickle, but with no 'segments' list")
    return data


def _int(v: Any) -> int:
    """A size as the C reader reads it (``as_int``): an int64 or a bool as it is, a float within int64 truncated,
    anything else (a 5000-digit int, NaN, infinity, a string) 0."""
    if type(v) is int:
        return v if -INT64_LIMIT < v < INT64_LIMIT else 0
    if type(v) is bool:
        return int(v)
    if type(v) is float:
        return int(v) if -9.2e18 < v < 9.2e18 else 0  # NaN fails both comparisons
    return 0


def _raw(v: Any) -> int | bool | float | None:
    """An out-of-memory event's number as both readers report it (``raw_number``): an int64, a bool or a float
    as it is, anything else None."""
    if type(v) is int:
        return v if -INT64_LIMIT < v < INT64_LIMIT else None
    return v if type(v) in (bool, float) else None


class OutOfRange(Exception):
    """A figure of the summary does not fit in 64 bits (``E_RANGE`` in the C reader): sizes no device holds."""


def _check_range(f: dict[str, Any]) -> None:
    """Raise :class:`OutOfRange` when a figure the C reader keeps in 64 bits (``in_range``) does not fit."""
    figures = [f[k] for k in ("reserved", "allocated", "requested", "free", "live", "trace_peak")]
    figures += [
        *f["timeline_allocated"],
        *f["timeline_reserved"],
        *f["all_site_bytes"],
        *f["phases"].values(),
    ]
    if any(not -INT64_LIMIT < v < INT64_LIMIT for v in figures):
        raise OutOfRange


TIMELINE_POINTS = native.TIMELINE_POINTS
"""Most points the timeline of a trace keeps (``TL_POINTS`` in the C reader). Each point is the most bytes live
(and reserved) over ``stride`` consecutive events (the last point: over the events left); when the points run
out, neighbours are merged in pairs and the stride doubles, so a trace of any length is kept in this many
points and the timeline's highest point is the trace's peak."""
_LOW = -(1 << 63)  # below any point (INT64_MIN in the C reader); an open point with an event is above it
_SEGMENT_GROWS = ("segment_alloc", "segment_map")  # tuples: an action that is a list (a file nobody vetted)
_SEGMENT_SHRINKS = ("segment_free", "segment_unmap")  # is compared, never hashed


class SnapshotSummary:
    """The explanation, built one segment and one trace event at a time (both readers feed it).

    ``budget``: how many segments, blocks, trace events and frames it may walk before it raises
    :class:`TooMuchWork` (None: no limit, for data built in memory).
    """

    def __init__(self, budget: int | None = None) -> None:
        self.counter = WorkCounter(budget)  # plaindata's one rule: a part reached again is counted again
        self._spend = self.counter.spend
        self.segments = self.blocks = self.reserved = self.allocated = self.requested = 0
        self.free = self.largest_free = 0
        self.phases = [0] * len(PHASES)
        self.by_site: dict[str, int] = {}
        self.largest: list[tuple[int, str]] = []
        self.ooms: list[dict[str, Any]] = []
        self.trace_events = self.live = self.trace_peak = 0
        self.trace_peak_at = -1
        self.reserved_live = 0
        """Reserved bytes above the trace's start, from its segment events (cudaMalloc'd and released)."""
        self.segment_events = 0
        self.tl_allocated: list[int] = []  # the timeline's completed points
        self.tl_reserved: list[int] = []
        self.tl_stride = 1
        self.tl_fill = 1  # events left in the open point
        self.tl_a = self.tl_r = _LOW  # the most live and reserved in the open point
        # site and phase of a traceback, keyed by the ids of its frame dicts: torch shares one dict per distinct
        # frame, so a new list of old frames hits. The entry holds the list, so no id in a key can be reused
        # while it is cached; cleared when full, which bounds what it pins (every frame new: no hits, little kept).
        self.tb_facts: dict[tuple[int, ...], tuple[list[Any], tuple[str, int]]] = {}

    def segment(self, seg: Any) -> None:
        """One element of ``segments``."""
        self.segments += 1
        if not isinstance(seg, dict):
            return
        self.reserved += _int(seg.get("total_size"))
        blocks = seg.get("blocks")
        if not isinstance(blocks, list):
            return
        self._spend(1 + len(blocks))
        # the hot loop (millions of blocks in a large snapshot): locals, and the int check inlined
        by_site, largest, facts_of, phases = self.by_site, self.largest, self._facts, self.phases
        n = allocated = requested = free = 0
        largest_free = self.largest_free
        for b in blocks:
            if type(b) is not dict:
                continue
            state = b.get("state")
            size = b.get("size")
            if type(size) is not int or not -INT64_LIMIT < size < INT64_LIMIT:
                size = _int(size)
            if state == "active_allocated":
                n += 1
                allocated += size
                req = b.get("requested_size", size)
                requested += req if type(req) is int and -INT64_LIMIT < req < INT64_LIMIT else _int(req)
                site, phase = facts_of(b.get("frames"))
                by_site[site] = by_site.get(site, 0) + size
                phases[phase] += size
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

    @property
    def work(self) -> int:
        """Units walked so far (segments, blocks, trace events, frames)."""
        return self.counter.work

    def _facts(self, frames: Any) -> tuple[str, int]:
        if type(frames) is not list:
            return traceback_facts(frames)
        self._spend(len(frames))  # the key below walks them all, cached or not
        key = tuple(map(id, frames))
        hit = self.tb_facts.get(key)
        if hit is not None:
            return hit[1]
        facts = traceback_facts(frames)
        if len(self.tb_facts) >= 20_000:
            self.tb_facts.clear()
        self.tb_facts[key] = (frames, facts)
        return facts

    def trace_event(self, device: int, e: Any) -> None:
        """One element of ``device_traces[device]``: live bytes over the trace, and the OOM events."""
        if not isinstance(e, dict):
            return
        self._spend(1)
        self.trace_events += 1
        action = e.get("action")
        if action == "alloc":
            self.live += _int(e.get("size"))
            if self.live > self.trace_peak:
                self.trace_peak, self.trace_peak_at = self.live, self.trace_events - 1
        elif action == "free_completed":
            self.live -= _int(e.get("size"))
        elif action in _SEGMENT_GROWS:
            self.reserved_live += _int(e.get("size"))
            self.segment_events += 1
        elif action in _SEGMENT_SHRINKS:
            self.reserved_live -= _int(e.get("size"))
            self.segment_events += 1
        elif action == "oom":
            self.ooms.append(
                {
                    "device": device,
                    "bytes": _raw(e.get("size")),
                    "site": self._facts(e.get("frames"))[0],
                    "device_free": _raw(e.get("device_free")),
                }
            )
            del self.ooms[:-5]
        # the timeline (TIMELINE_POINTS): scalars for the open point, so an event costs two compares
        if self.live > self.tl_a:
            self.tl_a = self.live
        if self.reserved_live > self.tl_r:
            self.tl_r = self.reserved_live
        self.tl_fill -= 1
        if not self.tl_fill:
            self._timeline_close()

    def _timeline_close(self) -> None:
        """The open point is complete: keep it; at :data:`TIMELINE_POINTS` points merge neighbours in pairs and
        double the stride (``timeline_close`` in the C reader)."""
        self.tl_allocated.append(self.tl_a)
        self.tl_reserved.append(self.tl_r)
        if len(self.tl_allocated) == TIMELINE_POINTS:
            a, r = self.tl_allocated, self.tl_reserved
            self.tl_allocated = [max(a[i], a[i + 1]) for i in range(0, TIMELINE_POINTS, 2)]
            self.tl_reserved = [max(r[i], r[i + 1]) for i in range(0, TIMELINE_POINTS, 2)]
            self.tl_stride *= 2
        self.tl_fill = self.tl_stride
        self.tl_a = self.tl_r = _LOW

    def fields(self) -> dict[str, Any]:
        """What :func:`explanation` needs, as the native reader returns it too."""
        sites = sorted(self.by_site.items(), key=lambda kv: kv[1], reverse=True)[:10]
        return {
            "segments": self.segments,
            "blocks": self.blocks,
            "reserved": self.reserved,
            "allocated": self.allocated,
            "requested": self.requested,
            "free": self.free,
            "largest_free": self.largest_free,
            "trace_events": self.trace_events,
            "live": self.live,
            "trace_peak": self.trace_peak,
            "trace_peak_at": self.trace_peak_at,
            "segment_events": self.segment_events,
            "timeline_stride": self.tl_stride,
            # the open point too, when an event went into it
            "timeline_allocated": self.tl_allocated + ([self.tl_a] if self.tl_fill != self.tl_stride else []),
            "timeline_reserved": self.tl_reserved + ([self.tl_r] if self.tl_fill != self.tl_stride else []),
            "sites": sites,
            "largest": list(self.largest),
            "ooms": list(self.ooms),
            "phases": dict(zip(PHASES, self.phases, strict=True)),
        }

    def result(self) -> dict[str, Any]:
        """Plain JSON; :class:`OutOfRange` when a figure does not fit in 64 bits."""
        fields = self.fields()
        _check_range({**fields, "all_site_bytes": self.by_site.values()})
        return explanation(fields)


def explanation(f: dict[str, Any]) -> dict[str, Any]:
    """The explanation (plain JSON) from a summary's fields, whichever reader built them."""
    share = f["free"] / f["reserved"] if f["reserved"] else 0.0
    return {
        "segments": f["segments"],
        "blocks": f["blocks"],
        "reserved": f["reserved"],
        "allocated": f["allocated"],
        "requested": f["requested"],
        "reserved_free": f["free"],
        "fragmentation_share": share,
        "largest_free": f["largest_free"],
        "sites": [{"name": s, "bytes": v} for s, v in f["sites"]],
        "largest": [{"bytes": n, "site": s} for n, s in f["largest"]],
        "ooms": f["ooms"],
        "trace": {
            "events": f["trace_events"],
            "peak_live": f["trace_peak"],
            "peak_at_event": f["trace_peak_at"],
            "timeline": {
                "stride": f["timeline_stride"],
                "allocated": list(f["timeline_allocated"]),
                # reserved over time only where the trace recorded its segments being mapped and released
                "reserved": list(f["timeline_reserved"]) if f["segment_events"] else None,
            },
        },
        "phases": dict(f["phases"]),
        "expandable_segments_advised": share > 0.2,
    }


def explain(data: dict[str, Any], budget: int | None = None) -> dict[str, Any]:
    """Totals, fragmentation, sites, trace peak and out-of-memory events of a loaded snapshot (plain JSON).

    ``budget``: see :class:`SnapshotSummary` (:class:`TooMuchWork` beyond it).
    """
    summary = SnapshotSummary(budget)
    for seg in data["segments"]:
        summary.segment(seg)
    traces = data.get("device_traces")
    for device, trace in enumerate(traces if isinstance(traces, list) else ()):
        if isinstance(trace, list):
            for e in trace:
                summary.trace_event(device, e)
    return summary.result()


def _too_much_work(path: Path, budget: int) -> UsageError:
    return UsageError(
        f"{path} is not a snapshot torch wrote: it names its own parts over and over, asking for more than "
        f"{budget:,} blocks, frames and trace events from {path.stat().st_size:,} bytes, which this reader refuses."
    )


def _out_of_range(path: Path) -> UsageError:
    return UsageError(
        f"{path} is not a snapshot torch wrote: its sizes add up to 2^63 bytes or more, which no device holds "
        "and this reader refuses."
    )


def _native_error(path: Path, err: native.ScanError) -> ScalpelError:
    if err.code == native.E_REFUSED:
        what = _WHAT.get(err.message, "is not plain data")
        return UsageError(
            f"{path} is not a plain PyTorch memory snapshot: at byte {err.offset} it {what} "
            f"(pickle opcode {err.message}), which this reader refuses (only containers and "
            "numbers are allowed)."
        )
    if err.code == native.E_TRUNCATED:
        return _truncated(path, f"{err.message}, at byte {err.offset}")
    if err.code == native.E_IO:
        return UsageError(f"Cannot read {path}: {err.message}.")
    if err.code == native.E_NOMEM:
        return ScalpelError(f"Reading {path} ran out of memory in the native reader.")
    if err.code == native.E_WORK:
        return _too_much_work(path, native.work_budget(path.stat().st_size))
    if err.code == native.E_RANGE:
        return _out_of_range(path)
    return _not_snapshot(path, f"{err.message}, at byte {err.offset}")


def _read_native(
    path: Path, lib: Any, progress: native.Progress | None
) -> tuple[dict[str, Any], dict[str, int]]:
    try:
        fields, stats = native.summarize(lib, path, frame_code, progress)
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
    result = _read_python(path)
    result.update(reader="python", reader_note=why)
    return result


def _read_python(path: Path) -> dict[str, Any]:
    """The pure-Python reader: the whole file loaded, then explained within the file's work budget.

    The collector is off throughout (millions of acyclic containers: collections would only cost time), and
    the snapshot's objects are freed before it is on again, whichever way the read ends: a collection with
    them still alive (as the interrupt's traceback kept them) walked them all, 2 s for 34 MB, and Ctrl-C then
    took that long to end the command.
    """
    gc_was = gc.isenabled()
    gc.disable()
    try:
        budget = native.work_budget(path.stat().st_size)
        return explain(load_snapshot(path), budget)
    except TooMuchWork as exc:
        traceback.clear_frames(exc.__traceback__)  # the refusal's context keeps it (see above)
        raise _too_much_work(path, budget) from None
    except OutOfRange as exc:
        traceback.clear_frames(exc.__traceback__)
        raise _out_of_range(path) from None
    except BaseException as exc:  # Ctrl-C above all: its traceback's frames hold the snapshot; let it go now
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        if gc_was:
            gc.enable()


def explain_snapshot(path: Path, progress: native.Progress | None = None) -> dict[str, Any]:
    """Load (safely) and explain ``path``; ``read_s`` is the wall time both took."""
    t0 = time.perf_counter()
    result = read_snapshot(path, progress)
    result["read_s"] = time.perf_counter() - t0
    result["path"] = str(path)
    return result

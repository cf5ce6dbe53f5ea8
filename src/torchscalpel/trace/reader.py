"""Streaming reader for Chrome / Kineto trace files (``.json`` and ``.json.gz``) of any size.

Design (chosen by measurement, see docs/analyze.md and benchmarks/trace_analysis.py): the file is
read in fixed-size chunks (gzip decompressed incrementally with :mod:`zlib`); each chunk is cut at
the last ``}, {`` boundary between two events of the ``traceEvents`` array and the piece is decoded
in one call by msgspec into small typed structs that keep only the fields the analyses use (unknown
keys are skipped inside the C decoder, so no per-key Python work). Memory stays bounded by the chunk
size plus the compact per-event arrays the analyses keep, never by the file size.

A cut can land inside a nested object or a string (``}, {`` is legal there); such a piece is not
valid JSON, so it is detected, decoded event by event, and the unfinished event is carried into the
next chunk. A piece that is broken before its end is a corrupt file; input that ends mid-event is a
truncated file. Both raise :class:`TraceReadError` with the byte offset, after the events before it
were handed to the caller, so partial results survive.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchscalpel.errors import ScalpelError, UsageError

try:  # the fast decoder (extra "trace"); without it the same design runs on the stdlib json module
    import msgspec
except ImportError:  # pragma: no cover - depends on the environment
    msgspec = None  # type: ignore[assignment]

CHUNK_BYTES = 8 << 20
# The longest single event we accept before calling the file corrupt (protects memory on garbage input: the
# buffer holding an unfinished event grows to this, and RSS to about twice it). Profilers write events of a
# few KB (the longest are stack strings); 64 MiB of one event is a corrupt or hostile file.
MAX_EVENT_BYTES = 64 << 20
# How far into the JSON text the ``"traceEvents": [`` may start (the metadata keys before it are a few KB).
MAX_HEADER_BYTES = 16 << 20
# Set to False to decode with the stdlib json module (what runs when msgspec is not installed).
USE_MSGSPEC = True
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
# ``}, {`` between two events (whitespace allowed); found by the C regex engine, never a Python loop per comma.
_SEP = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_SEP_OVERLAP = 64  # bytes re-searched at a window's edge so a separator cut by it is still seen
_SKIP = re.compile(rb"\s*,?\s*")
_DEPTH = "an event nested too deeply to read"


class TraceReadError(ScalpelError):
    """A trace that is truncated or not valid JSON; ``offset`` is the byte offset in the (decompressed) JSON."""

    def __init__(self, path: Path, offset: int, reason: str, events_read: int) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        self.events_read = events_read
        super().__init__(
            f"{path} is {reason} at byte {offset} of its JSON text ({events_read} events could be read "
            "before it); re-export the trace or pass the complete file."
        )


TRACE_SHAPE = (
    'a trace is a JSON object {"traceEvents": [{"name": ..., "ph": "X", "ts": ..., "dur": ...}, ...]} '
    "(or a bare array of such event objects), as torch.profiler's export_chrome_trace writes it"
)


class NotATraceError(UsageError):
    """A file that is JSON (or gzip) but not a trace: a usage error (exit 2), with what a trace looks like."""

    def __init__(self, path: Path, why: str) -> None:
        self.path = path
        super().__init__(f"{path} is not a torch.profiler trace ({why}); {TRACE_SHAPE}.")


class _PlainArgs:
    """Stand-in for the msgspec struct when msgspec is not installed (same attributes)."""

    __slots__ = ("correlation", "device_id", "device_type", "nbytes", "stream", "total_allocated")

    def __init__(
        self,
        correlation=None,
        stream=None,
        total_allocated=None,
        nbytes=None,
        device_type=None,
        device_id=None,
    ) -> None:
        self.correlation, self.stream, self.total_allocated = correlation, stream, total_allocated
        self.nbytes, self.device_type, self.device_id = nbytes, device_type, device_id


class _PlainEvent:
    """Stand-in for the msgspec struct when msgspec is not installed (same attributes)."""

    __slots__ = ("args", "cat", "dur", "name", "ph", "pid", "tid", "ts")

    def __init__(self, ph="", name="", cat="", ts=None, dur=None, pid=None, tid=None, args=None) -> None:
        self.ph, self.name, self.cat, self.ts, self.dur = ph, name, cat, ts, dur
        self.pid, self.tid, self.args = pid, tid, args


if msgspec is not None:

    class Args(msgspec.Struct, gc=False):
        """The ``args`` keys the analyses read; everything else is skipped by the decoder."""

        correlation: float | None = None
        stream: int | str | None = None
        total_allocated: float | None = msgspec.field(default=None, name="Total Allocated")
        nbytes: float | None = msgspec.field(default=None, name="Bytes")
        device_type: int | None = msgspec.field(default=None, name="Device Type")
        device_id: int | None = msgspec.field(default=None, name="Device Id")

    class Event(msgspec.Struct, gc=False):
        """One trace event, reduced to what the analyses need."""

        ph: str = ""
        name: str = ""
        cat: str = ""
        ts: float | None = None
        dur: float | None = None
        pid: int | str | None = None
        tid: int | str | None = None
        args: Args | None = None

    _DECODER: Any = msgspec.json.Decoder(list[Event])

else:  # pragma: no cover - exercised by test_reader_without_msgspec through a flag
    Args, Event = _PlainArgs, _PlainEvent  # type: ignore[misc]
    _DECODER = None

_ARGS_FIELDS = {
    "correlation": "correlation",
    "stream": "stream",
    "Total Allocated": "total_allocated",
    "Bytes": "nbytes",
    "Device Type": "device_type",
    "Device Id": "device_id",
}


def _event_from_dict(d: Any) -> Event | None:
    """Slow path for events whose field types do not match :class:`Event` (rare, non-Kineto writers)."""
    if not isinstance(d, dict):
        return None

    def num(v: Any) -> float | None:
        try:
            return float(v) if v is not None else None
        except (TypeError, ValueError):
            return None

    args = d.get("args")
    raw_args: dict[str, Any] = args if isinstance(args, dict) else {}
    kw: dict[str, Any] = {}
    for key, attr in _ARGS_FIELDS.items():
        if key in raw_args:
            v = raw_args[key]
            if attr == "stream":
                kw[attr] = v if isinstance(v, int | str) else None
            elif attr in ("device_type", "device_id"):
                n = num(v)
                kw[attr] = int(n) if n is not None else None
            else:
                kw[attr] = num(v)
    pid, tid = d.get("pid"), d.get("tid")
    return Event(
        ph=str(d.get("ph", "")),
        name=str(d.get("name", "")),
        cat=str(d.get("cat", "") or ""),
        ts=num(d.get("ts")),
        dur=num(d.get("dur")),
        pid=pid if isinstance(pid, int | str) else None,
        tid=tid if isinstance(tid, int | str) else None,
        args=Args(**kw) if kw else None,
    )


def _iter_decompressed(path: Path, chunk: int) -> Iterator[tuple[bytes, bool]]:
    """Yield ``(data, complete)``; a last ``(b"", False)`` means the gzip stream ended early (truncated)."""
    with path.open("rb") as fh:
        if path.suffix != ".gz":
            while block := fh.read(chunk):
                yield block, True
            return
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        # Every piece is at most ``chunk`` bytes however well the input compresses (max_length; the rest
        # waits in unconsumed_tail): a 1 MB gzip of 1 GiB used to come out in two 512 MB pieces.
        while block := fh.read(max(chunk // 16, 1 << 16)):
            while block:
                try:
                    out = d.decompress(block, chunk)
                except zlib.error as exc:
                    raise TraceReadError(path, 0, f"not a valid gzip file ({exc})", 0) from None
                if out:
                    yield out, True
                block = d.unconsumed_tail
                if not block and d.eof and d.unused_data.strip(b"\0"):  # concatenated gzip members
                    block = d.unused_data
                    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        if not d.eof:
            tail = d.flush()
            if tail:
                yield tail, True
            yield b"", False


class _Piece:
    """What decoding one piece gave: events, bytes consumed, where the array closed, a fatal error."""

    __slots__ = ("closed_at", "consumed", "error", "events")

    def __init__(
        self,
        events: list[Event],
        consumed: int,
        closed_at: int | None = None,
        error: TraceReadError | None = None,
    ) -> None:
        self.events = events
        self.consumed = consumed
        self.closed_at = closed_at
        self.error = error


class TraceReader:
    """Iterate over the events of one trace file in batches; ``meta`` holds the top-level keys.

    >>> reader = TraceReader(Path("trace.json.gz"))
    >>> for batch in reader.batches(): ...   # lists of :class:`Event`
    >>> reader.meta.get("distributedInfo")
    """

    def __init__(self, path: Path, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.path = Path(path)
        self.chunk_bytes = chunk_bytes
        self.meta: dict[str, Any] = {}
        self.bytes_read = 0  # decompressed JSON bytes seen
        self.events_read = 0
        # Bytes the splitter searched plus bytes handed to a decoder: stays within a small multiple of
        # ``bytes_read`` on any input (the splitter never rescans, a failed piece is retried only after
        # the buffer has doubled), which is what keeps the reader linear.
        self.bytes_scanned = 0
        self.largest_piece = 0  # the most decompressed bytes handed over at once (at most chunk_bytes)
        self.buffer_peak = 0  # the longest the buffer of undecoded text grew
        self.non_objects = 0  # array items that are not event objects ([1, 2, 3])

    def _error(self, offset: int, reason: str) -> TraceReadError:
        return TraceReadError(self.path, offset, reason, self.events_read)

    def batches(self) -> Iterator[list[Event]]:
        """Yield lists of events; raise :class:`TraceReadError` after yielding everything readable."""
        buf = b""
        base = 0  # absolute offset of buf[0] in the JSON text
        in_array = False
        tail: list[bytes] | None = None  # bytes after the array's closing bracket
        gz_complete = True
        floor = 0  # buf[:floor] holds no separator (searched already)
        retry_at = 0  # a piece that failed to decode is retried only once buf is this long
        for data, complete in _iter_decompressed(self.path, self.chunk_bytes):
            gz_complete = complete
            self.bytes_read += len(data)
            self.largest_piece = max(self.largest_piece, len(data))
            if tail is not None:
                if sum(map(len, tail)) > MAX_HEADER_BYTES:
                    raise self._error(
                        base, f"corrupt (over {MAX_HEADER_BYTES >> 20} MiB after its event array)"
                    )
                tail.append(data)
                continue
            buf += data
            self.buffer_peak = max(self.buffer_peak, len(buf))
            if not in_array:
                start = self._array_start(buf)
                if start is None:
                    if len(buf) > MAX_HEADER_BYTES:
                        raise NotATraceError(
                            self.path, f'no "traceEvents" array in its first {MAX_HEADER_BYTES >> 20} MiB'
                        )
                    continue
                base += start
                buf = buf[start:]
                in_array = True
            if len(buf) < retry_at:
                continue
            cut = _last_sep(buf, floor)
            self.bytes_scanned += len(buf) - floor
            if cut is None:
                if len(buf) > MAX_EVENT_BYTES:
                    raise self._error(base, f"corrupt (no event boundary in {MAX_EVENT_BYTES >> 20} MiB)")
                floor = max(0, len(buf) - _SEP_OVERLAP)
                continue
            self.bytes_scanned += cut[0] + 1
            piece = self._decode(buf, cut[0] + 1, base, final=False)
            if piece.events:
                self.events_read += len(piece.events)
                yield piece.events
            if piece.error is not None:
                raise piece.error
            if piece.closed_at is not None:
                tail = [buf[piece.closed_at + 1 :]]
                buf = b""
                continue
            nxt = _skip_sep(buf, piece.consumed)
            searched = len(buf)
            base += nxt
            buf = buf[nxt:]
            # Nothing after the cut is a separator: never search those bytes again; and when the cut
            # fell inside an event, decode that event again only once the buffer has doubled.
            floor = max(0, searched - nxt - _SEP_OVERLAP)
            retry_at = 2 * len(buf) if piece.consumed < cut[0] + 1 else 0
        if not in_array:
            if self.bytes_read == 0:
                raise self._error(0, "empty")
            raise NotATraceError(self.path, 'it has no "traceEvents" array')
        if tail is None:
            self.bytes_scanned += len(buf)
            piece = self._decode(buf, len(buf), base, final=True)
            if piece.events:
                self.events_read += len(piece.events)
                yield piece.events
            if piece.error is not None:
                raise piece.error
            if piece.closed_at is None:
                reason = "truncated" if gz_complete else "truncated (its gzip stream ends early)"
                raise self._error(base + piece.consumed, reason)
            tail = [buf[piece.closed_at + 1 :]]
        self._read_tail(b"".join(tail))
        if self.events_read == 0 and self.non_objects:
            raise NotATraceError(self.path, f"its array holds {self.non_objects} item(s) and no event object")
        if not gz_complete:
            raise self._error(self.bytes_read, "truncated (its gzip stream ends early)")

    def _array_start(self, buf: bytes) -> int | None:
        """Offset just after the ``[`` that opens the event array (reading the keys before it), or None."""
        stripped = buf.lstrip()
        if stripped[:1] == b"[":  # Chrome's bare-array form: the whole file is the event array
            return len(buf) - len(stripped) + 1
        m = _ARRAY_START.search(buf)
        if m is None:
            return None
        self._read_header(buf[: m.start()])
        return m.end()

    def _decode(self, buf: bytes, end: int, base: int, *, final: bool) -> _Piece:
        """Decode the events in ``buf[:end]`` in one C call, or event by event when that fails."""
        piece = buf[:end]
        if _DECODER is None or not USE_MSGSPEC:
            try:
                raw = json.loads(b"[" + piece + b"]")
                return _Piece(self._from_dicts(raw), end)
            except (ValueError, RecursionError):
                return self._decode_slow(piece, base, final=final)
        try:
            return _Piece(_DECODER.decode(b"[" + piece + b"]"), end)
        except msgspec.ValidationError:
            try:
                raw = msgspec.json.decode(b"[" + piece + b"]")
                return _Piece(self._from_dicts(raw), end)
            except (msgspec.DecodeError, RecursionError):
                pass
        except (msgspec.DecodeError, RecursionError):
            pass
        return self._decode_slow(piece, base, final=final)

    def _decode_slow(self, piece: bytes, base: int, *, final: bool) -> _Piece:
        """Event-by-event decoding: finds the array's end, an unfinished last event, or the bad byte."""
        text = piece.decode("utf-8", errors="replace")
        ascii_only = len(text) == len(piece)
        dec = json.JSONDecoder()
        out: list[Event] = []
        pos = last_ok = 0
        n = len(text)
        while True:
            while pos < n and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= n:
                return _Piece(out, len(piece))
            if text[pos] == "]":
                return _Piece(
                    out, _to_bytes(text, pos, ascii_only), closed_at=_to_bytes(text, pos, ascii_only)
                )
            try:
                obj, nxt = dec.raw_decode(text, pos)
            except RecursionError:
                err = TraceReadError(
                    self.path,
                    base + _to_bytes(text, pos, ascii_only),
                    f"corrupt ({_DEPTH})",
                    self.events_read + len(out),
                )
                return _Piece(out, _to_bytes(text, last_ok, ascii_only), error=err)
            except json.JSONDecodeError as exc:
                at_end = exc.pos >= n - 1 or exc.msg.startswith("Unterminated string")
                consumed = _to_bytes(text, last_ok, ascii_only)
                if at_end and not final:  # the cut fell inside this event: finish it with the next chunk
                    return _Piece(out, consumed)
                if at_end:
                    return _Piece(out, _to_bytes(text, pos, ascii_only))  # caller reports truncation
                err = TraceReadError(
                    self.path,
                    base + _to_bytes(text, exc.pos, ascii_only),
                    f"corrupt ({exc.msg})",
                    self.events_read + len(out),
                )
                return _Piece(out, consumed, error=err)
            ev = _event_from_dict(obj)
            if ev is not None:
                out.append(ev)
            else:
                self.non_objects += 1
            pos = last_ok = nxt

    def _from_dicts(self, raw: list[Any]) -> list[Event]:
        events = [e for e in map(_event_from_dict, raw) if e is not None]
        self.non_objects += len(raw) - len(events)
        return events

    def _read_header(self, head: bytes) -> None:
        text = head.strip()
        if not text.startswith(b"{"):
            return
        body = text[1:].rstrip().rstrip(b",")
        try:
            self.meta.update(json.loads(b"{" + body + b"}"))
        except (ValueError, RecursionError):
            pass  # metadata is optional: a trace with odd top-level keys still analyses

    def _read_tail(self, tail: bytes) -> None:
        text = tail.strip()
        if text.startswith(b","):
            text = text[1:]
        text = text.rstrip()
        if text.endswith(b"}"):
            text = text[:-1]
        if not text.strip():
            return
        try:
            self.meta.update(json.loads(b"{" + text + b"}"))
        except (ValueError, RecursionError):
            pass


def _to_bytes(text: str, index: int, ascii_only: bool) -> int:
    return index if ascii_only else len(text[:index].encode("utf-8", errors="replace"))


def _last_sep(buf: bytes, floor: int = 0) -> tuple[int, int] | None:
    """``(index of '}', index of '{')`` of the last ``}, {`` in ``buf[floor:]``; None if there is none.

    Searches backwards in doubling windows with the C regex engine, so the cost is linear in the
    bytes searched whatever they hold (strings full of commas cost nothing extra), and the caller
    passes ``floor`` to never search the same bytes twice.
    """
    end = len(buf)
    window = 1 << 16
    while end > floor:
        start = max(floor, end - window)
        last = None
        for last in _SEP.finditer(buf, start, end):  # noqa: B007 - keep the last match
            pass
        if last is not None:
            return last.start(), last.end() - 1
        if start == floor:
            return None
        end = start + _SEP_OVERLAP
        window *= 2
    return None


def _skip_sep(buf: bytes, pos: int) -> int:
    """Index of the first byte of the next event after ``pos`` (skips whitespace and one comma)."""
    m = _SKIP.match(buf, pos)
    return m.end() if m else pos

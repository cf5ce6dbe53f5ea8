"""The native snapshot scanner: ``snapshot_scan.c`` compiled on first use, loaded through ctypes.

Why not a setuptools extension: the package must install and run with no compiler (a wheel built
offline, ``PYTHONPATH=src`` in a checkout, ``pip install -e .``), and a checkout has no build step. The
C source ships as package data; the first snapshot read compiles it with the system's C compiler
(``$CC``, else ``cc``/``gcc``/``clang``) into a cache folder (``$TORCHSCALPEL_CACHE_DIR``, else
``$XDG_CACHE_HOME/torchscalpel``, else ``~/.cache/torchscalpel``), named by a hash of the source, so a
changed source compiles again and an unchanged one never does. With no compiler, a failed compile, or
``TORCHSCALPEL_NATIVE=0``, :func:`load_library` says why and the caller uses the pure-Python reader.

:func:`stream` drives the scanner: pass 1 refuses anything that is not plain data and notes which memo
keys are fetched again; pass 2 hands over batches (each a small pickle building a list of pieces, plus
one event per piece saying where it belongs), which ONE restricted unpickler reads, so the memo of shared
objects carries from batch to batch and nothing else outlives its batch.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("snapshot_scan.c")
BATCH_BYTES = 4 << 20  # a batch is cut after this many bytes: bounds what one load() builds at once

E_OK, E_REFUSED, E_TRUNCATED, E_NOTPICKLE, E_SHAPE, E_NOMEM, E_IO = range(7)
EV_KEY, EV_VALUE, EV_OPEN1, EV_ELEM1, EV_OPEN2, EV_ELEM2 = range(1, 7)

_loaded: tuple[ctypes.CDLL | None, str] | None = None


@dataclass(frozen=True, slots=True)
class ScanError(Exception):
    """The scanner stopped: ``code`` is one of the E_ constants, ``offset`` the byte it stopped at."""

    code: int
    message: str
    offset: int


def cache_dir() -> Path:
    """Where the compiled scanner lives."""
    if os.environ.get("TORCHSCALPEL_CACHE_DIR"):
        return Path(os.environ["TORCHSCALPEL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torchscalpel"


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc and shutil.which(cc.split()[0]):
        return cc
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


def _compile(target: Path) -> str:
    """Compile SOURCE into ``target``; '' on success, else one line saying why not."""
    cc = _compiler()
    if cc is None:
        return "no C compiler found (set CC, or install gcc)"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        return f"the cache folder {target.parent} is not writable ({exc.strerror or exc})"
    try:
        proc = subprocess.run([*cc.split(), "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["no message"])[0]
            return f"the C compiler failed ({first})"
        os.replace(tmp, target)  # atomic: a concurrent reader sees the old file or the whole new one
        return ""
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the C compiler could not run ({exc})"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _declare(lib: ctypes.CDLL) -> None:
    p = ctypes.c_void_p
    lib.ts_open.restype, lib.ts_open.argtypes = p, [ctypes.c_char_p]
    lib.ts_scan.restype, lib.ts_scan.argtypes = ctypes.c_int, [p]
    lib.ts_next.restype = ctypes.c_longlong
    lib.ts_next.argtypes = [p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                            ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]
    lib.ts_error.restype, lib.ts_error.argtypes = ctypes.c_int, [p]
    lib.ts_message.restype, lib.ts_message.argtypes = ctypes.c_char_p, [p]
    lib.ts_offset.restype, lib.ts_offset.argtypes = ctypes.c_longlong, [p]
    lib.ts_stats.restype, lib.ts_stats.argtypes = None, [p, ctypes.POINTER(ctypes.c_uint64)]
    lib.ts_close.restype, lib.ts_close.argtypes = None, [p]


def load_library() -> tuple[ctypes.CDLL | None, str]:
    """The scanner library, compiled if needed, and '' ; or None and the reason (cached per process)."""
    global _loaded
    if os.environ.get("TORCHSCALPEL_NATIVE", "1") == "0":
        return None, "TORCHSCALPEL_NATIVE=0"
    if _loaded is not None:
        return _loaded
    if not sys.platform.startswith("linux") and sys.platform != "darwin":
        _loaded = (None, f"the native reader is not built on {sys.platform}")
        return _loaded
    if not SOURCE.is_file():
        _loaded = (None, f"{SOURCE.name} is missing from the installed package")
        return _loaded
    digest = hashlib.sha256(SOURCE.read_bytes() + platform.machine().encode() + sys.platform.encode()).hexdigest()
    target = cache_dir() / f"snapshot_scan-{digest[:16]}.so"
    why = "" if target.is_file() else _compile(target)
    if why:
        _loaded = (None, why)
        return _loaded
    try:
        lib = ctypes.CDLL(str(target))
        _declare(lib)
    except (OSError, AttributeError) as exc:
        _loaded = (None, f"the compiled reader does not load ({exc})")
        return _loaded
    _loaded = (lib, "")
    return _loaded


Sink = Callable[[int, int, Any], None]


def stream(lib: ctypes.CDLL, path: Path, unpickler: type, on_event: Sink) -> dict[str, int]:
    """Scan ``path`` and call ``on_event(code, arg, obj)`` for every piece; returns scanner counters.

    Pass 2 runs in a second thread (ctypes lets go of the GIL inside the C call), so cutting the next batch
    overlaps with unpickling and summarizing this one; at most two batches wait in between.
    Raises :class:`ScanError` when the scanner stops (``E_SHAPE``: the pickle is plain but not laid out
    as a snapshot the streamer handles; the caller then reads it whole).
    """
    ctx = lib.ts_open(os.fsencode(str(path)))
    if not ctx:
        raise ScanError(E_NOMEM, "out of memory", 0)
    batches: queue.Queue[tuple[bytes, bytes] | int] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def produce() -> None:
        data, events, n_events = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t()
        while not stop.is_set():
            n = lib.ts_next(ctx, ctypes.byref(data), ctypes.byref(events), ctypes.byref(n_events), BATCH_BYTES)
            item: tuple[bytes, bytes] | int = (
                (ctypes.string_at(data, n), ctypes.string_at(events, n_events.value * 8)) if n > 0 else int(n))
            while not stop.is_set():
                try:
                    batches.put(item, timeout=0.2)
                    break
                except queue.Full:
                    continue
            if not isinstance(item, tuple):
                return

    producer = threading.Thread(target=produce, name="snapshot-scan", daemon=True)
    try:
        if lib.ts_scan(ctx) != E_OK:
            raise _error(lib, ctx)
        bio = io.BytesIO()
        reader = unpickler(bio)
        count = 0
        producer.start()
        while True:
            item = batches.get()
            if not isinstance(item, tuple):
                if item < 0:
                    producer.join()
                    raise _error(lib, ctx)
                break
            count += 1
            bio.seek(0)
            bio.truncate()
            bio.write(item[0])
            bio.seek(0)
            objs = iter(reader.load())
            ev = array("I")
            ev.frombytes(item[1])
            del item
            for i in range(0, len(ev), 2):
                code = ev[i]
                obj = None if code in (EV_OPEN1, EV_OPEN2) else next(objs)
                on_event(code, ev[i + 1], obj)
            del objs
        stats = (ctypes.c_uint64 * 6)()
        lib.ts_stats(ctx, stats)
        return {"memo_entries": stats[0], "memo_kept": stats[1] - stats[5], "memo_released": stats[5],
                "opcodes": stats[2], "batches": count}
    finally:
        stop.set()
        if producer.is_alive():
            producer.join()
        lib.ts_close(ctx)


def _error(lib: ctypes.CDLL, ctx: int) -> ScanError:
    return ScanError(lib.ts_error(ctx), lib.ts_message(ctx).decode(errors="replace"), lib.ts_offset(ctx))

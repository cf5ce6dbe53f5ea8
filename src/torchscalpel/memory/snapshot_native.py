"""The native snapshot reader: ``snapshot_scan.c`` compiled on first use, loaded through ctypes.

``-fwrapv``: sums of sizes from a file nobody vetted may overflow, and wrapping is then defined behaviour.

Why not a setuptools extension: the package must install and run with no compiler (a wheel built
offline, ``PYTHONPATH=src`` in a checkout, ``pip install -e .``), and a checkout has no build step. The
C source ships as package data; the first snapshot read compiles it with the system's C compiler
(``$CC``, else ``cc``/``gcc``/``clang``) into a cache folder (``$TORCHSCALPEL_CACHE_DIR``, else
``$XDG_CACHE_HOME/torchscalpel``, else ``~/.cache/torchscalpel``), named by a hash of the source, so a
changed source compiles again and an unchanged one never does. With no compiler, a failed compile, or
``TORCHSCALPEL_NATIVE=0``, :func:`load_library` says why and the caller uses the pure-Python reader.

Loading a shared library runs its code, so the cache is checked before anything is loaded from it
(:func:`_safe_folder`, :func:`_trusted`): the library lives in a ``native`` folder of the cache that only
this user can write (made with mode 0700; one owned by someone else, a link, or writable by others is not
used), the library itself is owned by this user and writable by no one else, and its SHA-256, recorded in
``<library>.sha256`` when it was built, matches. A library that fails a check is built again; a folder that
fails one means the pure-Python reader, with the reason in its note.

:func:`summarize` drives it: pass 1 refuses anything that is not plain data and notes which memo keys are
fetched again; pass 2 evaluates the pickle in C and builds the explanation there (snapshot.py's
``SnapshotSummary``, the same rules), so no Python object is made per block, frame or event. Both passes
run in slices of :data:`SLICE_BYTES` of the file, or :data:`WORK_SLICE` units of the summary's walk, whichever
ends first, with ctypes letting go of the GIL inside each: between them a caller shows progress, and Ctrl-C
(which Python sees only when the C call returns) stops the read. The walk is bounded by :func:`work_budget`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the one counting rule of every pickle reader (plaindata), re-exported for the C reader's callers
from torchscalpel.fileio import user_cache_dir
from torchscalpel.plaindata import WORK_BASE as WORK_BASE
from torchscalpel.plaindata import WORK_PER_BYTE as WORK_PER_BYTE
from torchscalpel.plaindata import work_budget as work_budget

SOURCE = Path(__file__).with_name("snapshot_scan.c")
SLICE_BYTES = 16 << 20  # each C call reads this much of the file before it returns (progress, Ctrl-C: ~0.2 s)
WORK_SLICE = 1 << 22  # ... or walks this many blocks, frames and events (~10-50 ms), whichever comes first
TIMELINE_POINTS = 256
"""The most points of a trace's timeline (``TL_POINTS`` in the C source; snapshot.py's ``TIMELINE_POINTS``)."""

E_OK, E_REFUSED, E_TRUNCATED, E_NOTPICKLE, E_SHAPE, E_NOMEM, E_IO, E_NOSEG, E_WORK, E_RANGE = range(10)
SUMMARY_FIELDS = (
    "segments",
    "blocks",
    "reserved",
    "allocated",
    "requested",
    "free",
    "largest_free",
    "trace_events",
    "live",
    "trace_peak",
    "trace_peak_at",
)
"""The counters the explanation copies as they are (the first ones of :data:`COUNTERS`)."""
COUNTERS = (
    *SUMMARY_FIELDS,
    "n_largest",
    "n_ooms",
    "memo_entries",
    "memo_fetched",
    "memo_released",
    "opcodes",
    "nodes_made",
    "nodes_peak",
    "streamed_segments",
    "streamed_events",
    "sites",
    "kept_lists",
    "phase_other",
    "phase_parameters",
    "phase_gradients",
    "phase_optimizer_state",
    "phase_activations",
    "segment_events",
    "timeline_stride",
    "timeline_points",
)
"""The numbers ``ts_counters`` writes, in its order."""

_loaded: tuple[ctypes.CDLL | None, str] | None = None


@dataclass(frozen=True, slots=True)
class ScanError(Exception):
    """The scanner stopped: ``code`` is one of the E_ constants, ``offset`` the byte it stopped at."""

    code: int
    message: str
    offset: int


def cache_dir() -> Path:
    """Where the compiled scanner lives: :func:`torchscalpel.fileio.user_cache_dir`."""
    return user_cache_dir()


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc and shutil.which(cc.split()[0]):
        return cc
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


def _private(st: os.stat_result) -> bool:
    """Owned by this user and writable by no one else."""
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _safe_folder(folder: Path) -> str:
    """Make ``folder`` (mode 0700) or check the one there: '' when only this user can write it, else why not."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError as exc:
        return f"the cache folder {folder} cannot be made ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"the cache folder {folder} is not a plain folder, so a library in it is not loaded"
    if st.st_uid != os.getuid():
        return f"the cache folder {folder} belongs to another user, so a library in it is not loaded"
    if st.st_mode & 0o022:
        try:  # ours but open to others (made by an older version, or by hand): close it, then go on
            os.chmod(folder, 0o700)
        except OSError as exc:
            return f"the cache folder {folder} is writable by others and cannot be closed ({exc.strerror or exc})"
    return ""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _trusted(target: Path) -> bool:
    """The built library is a plain file of this user's, writable by no one else, with the hash recorded at build."""
    try:
        st = os.lstat(target)
        recorded = target.with_name(target.name + ".sha256")
        rst = os.lstat(recorded)
        return (
            stat.S_ISREG(st.st_mode)
            and stat.S_ISREG(rst.st_mode)
            and _private(st)
            and _private(rst)
            and recorded.read_text().strip() == _digest(target)
        )
    except (OSError, UnicodeDecodeError):
        return False


def _compile(target: Path) -> str:
    """Compile SOURCE into ``target`` (in a folder :func:`_safe_folder` made) and record its hash; '' on success,
    else one line saying why not."""
    cc = _compiler()
    if cc is None:
        return "no C compiler found (set CC, or install gcc)"
    try:
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)  # mode 0600
        os.close(fd)
    except OSError as exc:
        return f"the cache folder {target.parent} is not writable ({exc.strerror or exc})"
    try:
        proc = subprocess.run(
            [*cc.split(), "-O2", "-fwrapv", "-shared", "-fPIC", "-o", tmp, str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["no message"])[0]
            return f"the C compiler failed ({first})"
        os.chmod(tmp, 0o700)  # the compiler may have re-created it under the umask
        recorded = target.with_name(target.name + ".sha256")
        fd, tmp_hash = tempfile.mkstemp(suffix=".sha256", dir=target.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(_digest(Path(tmp)) + "\n")
        # library first, then its hash: a concurrent reader sees a mismatch (and builds again), never a
        # recorded hash that vouches for a library it did not check
        os.replace(tmp, target)
        os.replace(tmp_hash, recorded)
        return ""
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the C compiler could not run ({exc})"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _declare(lib: ctypes.CDLL) -> None:
    p, size, i32, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_int64
    lib.ts_open.restype, lib.ts_open.argtypes = p, [ctypes.c_char_p, FRAME_CODE]
    lib.ts_scan.restype, lib.ts_scan.argtypes = ctypes.c_int, [p, size]
    lib.ts_eval.restype, lib.ts_eval.argtypes = ctypes.c_int, [p, size]
    lib.ts_error.restype, lib.ts_error.argtypes = ctypes.c_int, [p]
    lib.ts_message.restype, lib.ts_message.argtypes = ctypes.c_char_p, [p]
    lib.ts_offset.restype, lib.ts_offset.argtypes = ctypes.c_longlong, [p]
    lib.ts_size.restype, lib.ts_size.argtypes = ctypes.c_longlong, [p]
    lib.ts_position.restype, lib.ts_position.argtypes = ctypes.c_longlong, [p]
    lib.ts_work.restype, lib.ts_work.argtypes = ctypes.c_longlong, [p]
    lib.ts_limits.restype, lib.ts_limits.argtypes = None, [p, ctypes.c_longlong, ctypes.c_longlong]
    lib.ts_counters.restype, lib.ts_counters.argtypes = None, [p, ctypes.POINTER(i64)]
    lib.ts_site.restype, lib.ts_site.argtypes = ctypes.c_char_p, [p, i32]
    lib.ts_top_sites.restype = ctypes.c_int
    lib.ts_top_sites.argtypes = [p, ctypes.c_int, ctypes.POINTER(i32), ctypes.POINTER(i64)]
    lib.ts_largest.restype, lib.ts_largest.argtypes = None, [p, ctypes.POINTER(i64), ctypes.POINTER(i32)]
    lib.ts_ooms.restype, lib.ts_ooms.argtypes = None, [p, ctypes.POINTER(i64)]
    lib.ts_timeline.restype, lib.ts_timeline.argtypes = None, [p, ctypes.POINTER(i64), ctypes.POINTER(i64)]
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
    digest = hashlib.sha256(
        SOURCE.read_bytes() + platform.machine().encode() + sys.platform.encode()
    ).hexdigest()
    folder = cache_dir() / "native"
    why = "no C compiler found (set CC, or install gcc)" if not folder.exists() and not _compiler() else ""
    why = why or _safe_folder(folder)
    if why:
        _loaded = (None, why)
        return _loaded
    target = folder / f"snapshot_scan-{digest[:16]}.so"
    why = "" if _trusted(target) else _compile(target)
    if not why and not _trusted(target):  # built, yet not what was built: someone else writes here
        why = f"the compiled reader {target} does not match the hash recorded when it was built"
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


FRAME_CODE = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_char),
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_char),
    ctypes.c_size_t,
)
"""The C reader asks this once per distinct frame (file name, function name): bit 0 the user's file
(read for ``.py`` files only), bits 1-3 the phase the function marks (``snapshot_frames.frame_code``)."""

Progress = Callable[[int, int], None]
"""``progress(done, total)``: bytes of both passes read so far, of twice the file's size."""


def _raw(kind: int, value: int) -> int | bool | float | None:
    """An out-of-memory event's number as the snapshot held it (kinds from ``ts_ooms``)."""
    if kind == 1:
        return value
    if kind == 2:
        return bool(value)
    if kind == 3:
        return struct.unpack("<d", struct.pack("<q", value))[0]
    return None


def summarize(
    lib: ctypes.CDLL,
    path: Path,
    frame_code: Callable[[str, str], int],
    progress: Progress | None = None,
    work_slice: int = WORK_SLICE,
) -> tuple[dict[str, Any], dict[str, int]]:
    """Read ``path`` in C: the summary's fields (as ``SnapshotSummary`` keeps them) and the reader's counters.

    ``work_slice``: how much of the walk one C call does before it returns (a test makes it small).

    ``frame_code(file, function)``: what a frame is (see :data:`FRAME_CODE`), asked once per distinct pair.
    Raises :class:`ScanError` when the reader stops; ``E_NOSEG``: a plain pickle that is not a snapshot.
    """

    interrupted: list[BaseException] = []

    def ask(file: Any, file_len: int, name: Any, name_len: int) -> int:
        if interrupted or pending:
            return 0
        try:
            return int(
                frame_code(
                    ctypes.string_at(file, file_len).decode("utf-8", "surrogateescape"),
                    ctypes.string_at(name, name_len).decode("utf-8", "surrogateescape"),
                )
            )
        except (
            Exception
        ):  # an exception cannot cross into C; a frame we cannot judge is a library's, no phase
            return 0
        except BaseException as exc:  # Ctrl-C that lands in this callback: ctypes would print and drop it,
            interrupted.append(exc)  # so it is raised once the C call returns (within one work slice)
            return 0

    callback = FRAME_CODE(ask)  # held here: C calls it until ts_close
    ctx = lib.ts_open(os.fsencode(str(path)), callback)
    if not ctx:
        raise ScanError(E_NOMEM, "out of memory", 0)
    pending: list[int] = []
    restore = _defer_sigint(pending)
    try:
        size = max(int(lib.ts_size(ctx)), 0)
        lib.ts_limits(ctx, work_budget(size), work_slice)
        calls = 0
        for phase, run in enumerate((lib.ts_scan, lib.ts_eval)):
            while True:
                upto = int(lib.ts_position(ctx)) + SLICE_BYTES
                state = run(ctx, upto) if lib.ts_error(ctx) == E_OK else -1
                calls += 1
                if interrupted:
                    raise interrupted[0]
                if pending:
                    raise KeyboardInterrupt
                if state < 0:
                    raise _error(lib, ctx)
                if progress is not None:
                    done = size if state == 0 else min(int(lib.ts_position(ctx)), size)
                    progress(phase * size + done, 2 * size)
                if state == 0:
                    break
        raw = (ctypes.c_int64 * len(COUNTERS))()
        lib.ts_counters(ctx, raw)
        n = dict(zip(COUNTERS, raw, strict=True))
        ids, sizes = (ctypes.c_int32 * 10)(), (ctypes.c_int64 * 10)()
        top = lib.ts_top_sites(ctx, 10, ids, sizes)
        sites = [(_site_text(lib.ts_site(ctx, ids[i])), int(sizes[i])) for i in range(top)]
        lib.ts_largest(ctx, sizes, ids)
        largest = [(int(sizes[i]), _site_text(lib.ts_site(ctx, ids[i]))) for i in range(n["n_largest"])]
        ooms_raw = (ctypes.c_int64 * (6 * 5))()
        lib.ts_ooms(ctx, ooms_raw)
        ooms = []
        for i in range(n["n_ooms"]):
            device, bytes_kind, nbytes, site, free_kind, free = ooms_raw[6 * i : 6 * i + 6]
            ooms.append(
                {
                    "device": device,
                    "bytes": _raw(bytes_kind, nbytes),
                    "site": _site_text(lib.ts_site(ctx, site)),
                    "device_free": _raw(free_kind, free),
                }
            )
        points = max(0, min(int(n["timeline_points"]), TIMELINE_POINTS))
        allocated, reserved = (ctypes.c_int64 * TIMELINE_POINTS)(), (ctypes.c_int64 * TIMELINE_POINTS)()
        lib.ts_timeline(ctx, allocated, reserved)
        fields = {k: n[k] for k in SUMMARY_FIELDS}
        fields.update(
            segment_events=n["segment_events"],
            timeline_stride=n["timeline_stride"],
            timeline_allocated=list(allocated[:points]),
            timeline_reserved=list(reserved[:points]),
            sites=sites,
            largest=largest,
            ooms=ooms,
            phases={k[len("phase_") :]: n[k] for k in COUNTERS if k.startswith("phase_")},
        )
        stats = {
            "memo_entries": n["memo_entries"],
            "memo_kept": n["memo_fetched"] - n["memo_released"],
            "memo_released": n["memo_released"],
            "opcodes": n["opcodes"],
            "nodes_made": n["nodes_made"],
            "nodes_peak": n["nodes_peak"],
            "streamed": n["streamed_segments"] == n["segments"],
            "streamed_events": n["streamed_events"],
            "kept_whole": n["kept_lists"],
            "work": int(lib.ts_work(ctx)),
            "calls": calls,
        }
        return fields, stats
    finally:
        restore()
        lib.ts_close(ctx)


def _defer_sigint(pending: list[int]) -> Callable[[], None]:
    """While the C reader runs, Ctrl-C is noted in ``pending`` instead of raised; returns what restores the handler.

    Python raises ``KeyboardInterrupt`` at whatever bytecode runs next, and with thousands of frame callbacks
    that is often inside one of them, where ctypes prints the exception and drops it (before the callback's own
    ``try`` nothing can catch it): Ctrl-C was lost and the read went on to exit 0. Noted here, the read stops at
    the end of the C call (a slice: well under a second) and raises it there. Only the default handler, in the
    main thread, is replaced: a handler of the program's own, or SIGINT ignored, is left as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        return lambda: None
    signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))

    def restore() -> None:
        signal.signal(signal.SIGINT, previous)

    return restore


def _site_text(raw: bytes) -> str:
    """A site's text as Python's unpickler decodes the same bytes (a lone surrogate stays one)."""
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:  # bytes no pickler writes (Python's own reader refuses the file)
        return raw.decode("utf-8", "replace")


def _error(lib: ctypes.CDLL, ctx: int) -> ScanError:
    return ScanError(lib.ts_error(ctx), lib.ts_message(ctx).decode(errors="replace"), lib.ts_offset(ctx))

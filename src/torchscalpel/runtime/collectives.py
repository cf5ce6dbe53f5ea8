"""What each rank is doing, written where the launcher can read it even when the rank hangs or dies.

``scalpel launch`` runs every rank through its per-rank entry point (``scalpel`` under torchrun), which calls
:func:`install_from_env` before the script starts. That:

- wraps the ``torch.distributed`` collectives (``all_reduce``, ``barrier``, ...) so each call is
  logged on entry and marked on completion: op, process group, per-group sequence number, shapes,
  dtypes and the user's ``file:line``;
- counts optimizer steps (a global step post hook) and keeps the median step time;
- registers :mod:`faulthandler` on :data:`STACK_SIGNAL`, so the launcher can ask for the Python
  stack of every thread even while the main thread is blocked inside a collective (faulthandler
  writes from the C signal handler, without the GIL).

Why a memory-mapped file and not a writer thread: a write into a shared mapping is a memory copy
(a few microseconds per collective) and reaches the file even when the process is killed or aborts
a moment later (gloo aborts a rank on a size mismatch); a thread would lose its last entries.

Layout: a fixed binary header (:data:`HEADER`), then :data:`SLOTS` slots of :data:`SLOT` bytes in a
ring, each one JSON object ended by a NUL byte, whose first bytes are ``{"done":D,`` with ``D``
rewritten in place (0 entered, 1 completed, 2 raised).

Why the entry is cheap (the log runs on every collective of every watched launch): the parts that
repeat from call to call are cached as ready bytes, the description of a collective (op, group,
shapes, dtypes: keyed by the live shape and dtype objects) and the caller's ``file:line`` (resolved
once per code object and line, so the frame walk is a dict lookup per frame); an entry is then one
bytes ``%`` format and one copy into the mapping, and completing it rewrites one byte and the three
header fields that changed (:data:`PROGRESS`).
"""

from __future__ import annotations

import faulthandler
import itertools
import json
import mmap
import os
import signal
import statistics
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchscalpel.runtime.flight_dumper import start_flight_dumper
from torchscalpel.runtime.hang_files import log_path, stacks_path
from torchscalpel.runtime.patching import replace_for_process
from torchscalpel.runtime.userframes import LIBRARIES, is_user_file, user_frame

STACK_SIGNAL = signal.SIGUSR2
"""The signal the launcher sends for stacks (SIGUSR1 is taken by SLURM/Lightning requeueing)."""
ENV_DIR = "TORCHSCALPEL_COLLECTIVE_DIR"
"""Folder for ``rank-R.log`` / ``rank-R.stacks.txt``; unset: nothing is installed."""
MAGIC = b"TSCOLL1\0"
HEADER = struct.Struct("<8s5I4Q3d")
"""magic, pid, rank, world, restart, finished, main thread id, steps, completed, entries, last progress, step ms,
started."""
PROGRESS = struct.Struct("<QQd")
"""completed, entries, last progress: the header fields a completed collective changes, written alone."""
PROGRESS_AT = struct.calcsize("<8s5I2Q")
HEADER_SIZE = 128
SLOTS = 256
SLOT = 512
FILE_SIZE = HEADER_SIZE + SLOTS * SLOT
_DONE_AT = len('{"done":')
ENTRY = b'{"done":0,"n":%d,"seq":%d,"t":%.3f,"site":%s,%s}\0'
"""One slot: number, per-group sequence number, time entered, quoted site, then :func:`describe_entry`'s bytes."""
BODY_MAX = 224
"""Bytes of op/group/shapes/dtypes in a slot; a longer tensor list keeps its first 4 shapes."""
SITE_MAX = 160
"""Bytes of the quoted ``file:line``; a longer path keeps its end."""
CACHE_MAX = 4096
"""Entries per cache before it is emptied (a script whose shapes change every step keeps paying a miss)."""

# op name -> (index of the tensor argument whose shape must agree across ranks or None, compare shapes)
OPS: dict[str, tuple[int | None, bool]] = {
    "all_reduce": (0, True),
    "broadcast": (0, True),
    "reduce": (0, True),
    "all_gather": (1, True),
    "all_gather_into_tensor": (1, True),
    "reduce_scatter": (0, True),
    "reduce_scatter_tensor": (1, True),
    "gather": (0, True),
    "scatter": (0, True),
    "all_to_all_single": (1, False),  # uneven splits are legal: dtype only
    "all_to_all": (None, False),
    "barrier": (None, False),
    "monitored_barrier": (None, False),
    "broadcast_object_list": (None, False),  # pickled sizes differ by design
    "all_gather_object": (None, False),
    "gather_object": (None, False),
    "scatter_object_list": (None, False),
}


def signature(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What must agree across ranks for the same collective: op, and shapes/dtypes where they must."""
    compare_shapes = OPS.get(entry.get("op", ""), (None, False))[1]
    return (
        entry.get("op"),
        tuple(map(tuple, entry.get("shapes") or ())) if compare_shapes else None,
        tuple(entry.get("dtypes") or ()),
    )


class _Depth(threading.local):
    depth = 0
    """1 while this thread is inside a logged collective (its nested ones are not the user's)."""


@dataclass(slots=True)
class RankLog:
    """One rank's file, as read back by the launcher."""

    pid: int
    rank: int
    world: int
    restart: int
    finished: bool
    """The script ran to its end (or the process is exiting): no longer a candidate for a hang."""
    main_thread: int
    steps: int
    completed: int
    last_progress: float
    step_ms: float
    started: float
    entries: list[dict[str, Any]] = field(default_factory=list)

    def pending(self) -> dict[str, Any] | None:
        """The newest collective entered and not completed (the one the rank waits in), if any."""
        for entry in reversed(self.entries):
            if entry.get("done") == 0:
                return entry
        return None


def read_rank_log(path: Path) -> RankLog | None:
    """Decode ``rank-R.log``; None when it is missing, short or not ours. Torn slots are skipped."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < FILE_SIZE or data[:8] != MAGIC:
        return None
    (_, pid, rank, world, restart, finished, tid, steps, completed, _n, last, step_ms, started) = (
        HEADER.unpack_from(data)
    )
    entries = []
    for i in range(SLOTS):
        raw = data[HEADER_SIZE + i * SLOT : HEADER_SIZE + (i + 1) * SLOT].split(b"\0", 1)[0]
        if raw:
            try:
                entries.append(json.loads(raw))
            except ValueError:
                continue
    entries.sort(key=lambda e: e.get("n", 0))
    return RankLog(
        pid, rank, world, restart, bool(finished), tid, steps, completed, last, step_ms, started, entries
    )


class CollectiveRecorder:
    """Writes this rank's collectives and steps into its memory-mapped log (see the module doc)."""

    def __init__(self, folder: Path, rank: int, world: int, restart: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = log_path(folder, rank)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, FILE_SIZE)
            self._mm = mmap.mmap(fd, FILE_SIZE)
        finally:
            os.close(fd)
        self.rank, self.world, self.restart = rank, world, restart
        self._lock = threading.Lock()
        self._local = _Depth()  # shared by every wrapped op: all_gather_object's inner all_gather is nested
        # Counters rather than a lock on the per-call path: next() on an itertools.count is atomic under
        # the GIL, so threads that issue collectives concurrently still get distinct slots and numbers.
        self._numbers = itertools.count()
        self._seqs: dict[str, Any] = {}
        self._completions = itertools.count(1)
        self._n = 0
        self.steps = 0
        self.completed = 0
        self._last_step: float | None = None
        self._intervals: deque[float] = deque(maxlen=32)
        self.started = self.last_progress = time.time()
        self.finished = False
        self._pid = os.getpid()
        self._tid = threading.main_thread().ident or 0
        self._step_ms = 0.0
        self._write_header()

    # -- header -------------------------------------------------------------------------------------
    def _write_header(self) -> None:
        HEADER.pack_into(
            self._mm,
            0,
            MAGIC,
            self._pid,
            self.rank,
            self.world,
            self.restart,
            int(self.finished),
            self._tid,
            self.steps,
            self.completed,
            self._n,
            self.last_progress,
            self._step_ms,
            self.started,
        )

    def mark_finished(self) -> None:
        """The script is done (its end, or interpreter exit): the watch stops counting this rank's silence."""
        with self._lock:
            self.finished = True
            self._write_header()

    def on_step(self, *_: Any) -> None:
        """Optimizer step post hook: progress, and one more step interval."""
        now = time.time()
        with self._lock:
            if self._last_step is not None:
                self._intervals.append(now - self._last_step)
                self._step_ms = statistics.median(self._intervals) * 1000.0
            self._last_step = now
            self.steps += 1
            self.last_progress = now
            self._write_header()

    # -- entries ------------------------------------------------------------------------------------
    # Why hand-written JSON from cached bytes: this runs twice per collective; json.dumps cost more than
    # all the rest, and so did rebuilding the same description text every call.
    def enter(self, op: str, group: str, shapes: list[list[int]], dtypes: list[str], site: str) -> int:
        """Log a collective this rank is entering; returns its slot for :meth:`finish`."""
        return self.enter_described(group, describe_entry(op, group, shapes, dtypes), quote_site(site))

    def seqs_for(self, group: str) -> Any:
        """The sequence-number counter of ``group`` (made on its first collective)."""
        seqs = self._seqs.get(group)
        if seqs is None:
            with self._lock:
                seqs = self._seqs.setdefault(group, itertools.count(1))
        return seqs

    def enter_described(self, group: str, body: bytes, site: bytes) -> int:
        """:meth:`enter` from prepared parts (:func:`describe_entry`, :func:`quote_site`); the wrapped
        collectives do the same inline (:func:`_wrap`)."""
        n = next(self._numbers)
        raw = ENTRY % (n, next(self.seqs_for(group)), time.time(), site, body)
        slot = n % SLOTS
        offset = HEADER_SIZE + slot * SLOT
        self._mm[offset : offset + len(raw)] = (
            raw  # the NUL ends it: an older, longer entry's tail is not read
        )
        self._n = n + 1
        return slot

    def finish(self, slot: int, ok: bool) -> None:
        """Mark the entry in ``slot`` completed (or raised)."""
        self._mm[HEADER_SIZE + slot * SLOT + _DONE_AT] = 49 if ok else 50  # ord("1"), ord("2")
        if ok:
            self.completed = next(self._completions)
            self.last_progress = time.time()
        PROGRESS.pack_into(self._mm, PROGRESS_AT, self.completed, self._n, self.last_progress)  # one C call


def describe_entry(op: str, group: str, shapes: list[list[int]], dtypes: list[str]) -> bytes:
    """A collective's slot members ``"op":..,"group":..,"dtypes":..,"shapes":..`` (cut to :data:`BODY_MAX`)."""
    shape_text = repr([list(x) for x in shapes]).replace(" ", "")  # lists of ints: valid JSON as written
    dtype_text = json.dumps(dtypes, separators=(",", ":"))
    head = f'"op":"{op}","group":{json.dumps(group)},'
    body = f'{head}"dtypes":{dtype_text},"shapes":{shape_text}'
    if len(body) > BODY_MAX:  # a long tensor list: keep the first shapes only
        cut = repr([list(x) for x in shapes[:4]]).replace(" ", "")
        body = (
            f'{head}"truncated":true,"dtypes":{json.dumps(dtypes[:4], separators=(",", ":"))},"shapes":{cut}'
        )
        if len(body) > BODY_MAX:
            body = f'{head}"truncated":true,"dtypes":[],"shapes":[]'
    return body.encode()


def quote_site(site: str) -> bytes:
    """The JSON string of a ``file:line``, its path's start dropped past :data:`SITE_MAX` bytes."""
    quoted = json.dumps(site).encode()
    if len(quoted) > SITE_MAX:
        quoted = json.dumps("..." + site[-(SITE_MAX // 2) :]).encode()
    return quoted


_SITES: dict[tuple[Any, int], bytes] = {}
"""(code object, line) -> quoted ``file:line``, for the per-call path."""
_USER_CODE: set[Any] = set()
"""Code objects of the user's (:mod:`~torchscalpel.runtime.userframes`) with a line in :data:`_SITES`: the per-call
path asks only this set and that cache when the collective's direct caller is the user's script."""


def _site_frame(frame: Any) -> Any:
    # A library's line (Lightning's, the stdlib's) is named when no user frame is on the stack (a
    # library's own thread): better than "?"; torch's and ours never are.
    return user_frame(frame, fallback=LIBRARIES)


def quoted_user_site(frame: Any) -> bytes:
    """:func:`user_site`, JSON-quoted (:func:`quote_site`), cached per code object and line."""
    found = _site_frame(frame)
    if found is None:
        return b'"?"'
    key = (found.f_code, found.f_lineno)
    quoted = _SITES.get(key)
    if quoted is None:
        if len(_SITES) > CACHE_MAX:
            _SITES.clear()
            _USER_CODE.clear()
        quoted = _SITES[key] = quote_site(f"{key[0].co_filename}:{key[1]}")
        if is_user_file(key[0].co_filename):
            _USER_CODE.add(key[0])
    return quoted


_DTYPES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPES.get(dtype)
    if name is None:
        name = _DTYPES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _describe(value: Any) -> tuple[list[list[int]], list[str]]:
    if isinstance(value, list | tuple):
        pairs = [
            (list(t.shape), _dtype_name(t.dtype))
            for t in value
            if hasattr(t, "shape") and hasattr(t, "dtype")
        ]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return [list(value.shape)], [_dtype_name(value.dtype)]
    return [], []


def _group_name(group: Any, member: Any) -> str:
    if group is None or group is member.WORLD:
        return "default"
    return f"group {getattr(group, 'group_name', id(group))}"


def _wrap(recorder: CollectiveRecorder, op: str, fn: Any) -> Any:
    import inspect

    import torch
    import torch.distributed as dist

    member = dist.GroupMember
    is_compiling = torch.compiler.is_compiling
    tensor_type = torch.Tensor
    params = list(inspect.signature(fn).parameters)
    group_at = params.index("group") if "group" in params else None
    tensor_at = OPS[op][0]
    tensor_name = params[tensor_at] if tensor_at is not None else None
    local = recorder._local
    described: dict[Any, tuple[str, bytes]] = {}  # (group, shape, dtype) -> (group name, body)
    # Bound once: the per-call path below is enter_described + finish written inline (every attribute
    # lookup and Python call there is paid on each collective, cold after the wait inside it).
    finish, getframe, now = recorder.finish, sys._getframe, time.time
    numbers, completions, seqs_of, mm = recorder._numbers, recorder._completions, recorder._seqs, recorder._mm

    def describe(group: Any, value: Any) -> tuple[str, bytes]:
        name = _group_name(group, member)
        shapes, dtypes = _describe(value)
        return name, describe_entry(op, name, shapes, dtypes)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # Nested calls (all_gather_object -> all_gather) and compiled code are not the user's collectives.
        if local.depth or is_compiling():
            return fn(*args, **kwargs)
        group = kwargs.get("group", args[group_at] if group_at is not None and len(args) > group_at else None)
        if tensor_name is not None and tensor_at is not None:  # set together above; both or neither
            value = kwargs.get(tensor_name, args[tensor_at] if len(args) > tensor_at else None)
        else:
            value = (
                (args[1] if len(args) > 1 else kwargs.get("input_tensor_list"))
                if op == "all_to_all"
                else None
            )
        if isinstance(value, tensor_type):  # the common case: one tensor, its description cached
            key = (group, value.shape, value.dtype)
            parts = described.get(key)
            if parts is None:
                if len(described) > CACHE_MAX:
                    described.clear()
                parts = described[key] = describe(group, value)
        else:
            parts = describe(group, value)
        frame = getframe(1)
        site = _SITES.get((frame.f_code, frame.f_lineno)) if frame.f_code in _USER_CODE else None
        n = next(numbers)
        raw = ENTRY % (
            n,
            next(seqs_of.get(parts[0]) or recorder.seqs_for(parts[0])),
            now(),
            site or quoted_user_site(frame),
            parts[1],
        )
        offset = HEADER_SIZE + (n % SLOTS) * SLOT
        mm[offset : offset + len(raw)] = raw
        recorder._n = n + 1
        local.depth = 1
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            local.depth = 0
            finish(n % SLOTS, False)
            raise
        local.depth = 0
        # finish(slot, True), inline; an async op (async_op=True) counts as completed once issued
        mm[offset + _DONE_AT] = 49  # ord("1")
        recorder.completed = done = next(completions)
        recorder.last_progress = t = now()
        PROGRESS.pack_into(mm, PROGRESS_AT, done, n + 1, t)
        return result

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    wrapper._scalpel_op = op  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(fn, "__name__", op)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper


_INSTALLED: list[Any] = []
"""The recorder and the open stacks file, alive for the process lifetime."""


def install(folder: Path, rank: int, world: int, restart: int = 0) -> CollectiveRecorder:
    """Start logging this rank's collectives and steps into ``folder`` (see the module doc)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.optim.optimizer import register_optimizer_step_post_hook

    recorder = CollectiveRecorder(folder, rank, world, restart)
    for op in OPS:
        fn = getattr(c10d, op, None)
        if fn is None or getattr(fn, "_scalpel_op", None):  # absent in this torch, or installed already
            continue
        wrapped = _wrap(recorder, op, fn)
        replace_for_process(c10d, op, wrapped)
        if getattr(dist, op, None) is fn:
            replace_for_process(dist, op, wrapped)
    register_optimizer_step_post_hook(recorder.on_step)
    from torchscalpel.runtime import rankfacts

    _INSTALLED.append(rankfacts.install(folder, rank, world))
    start_flight_dumper(folder, rank)
    stacks = open(stacks_path(folder, rank), "w")  # noqa: SIM115 - kept open for the signal handler
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True, chain=False)
    _INSTALLED.extend([recorder, stacks])
    import atexit

    atexit.register(recorder.mark_finished)
    return recorder


def mark_finished() -> None:
    """Tell the watch this rank's script has ended (a no-op when nothing is installed)."""
    for obj in _INSTALLED:
        if isinstance(obj, CollectiveRecorder):
            obj.mark_finished()


def install_from_env(env: Mapping[str, str] | None = None) -> CollectiveRecorder | None:
    """:func:`install` when ``scalpel launch`` asked for it (``TORCHSCALPEL_COLLECTIVE_DIR``)."""
    env = os.environ if env is None else env
    folder = env.get(ENV_DIR)
    if not folder:
        return None
    return install(
        Path(folder),
        int(env.get("RANK", "0")),
        int(env.get("WORLD_SIZE", "1")),
        int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
    )

"""One pass over a rank's events into compact columns (``array`` now, numpy at the end).

The per-event loop is the hot path of ``scalpel analyze``: it only appends numbers to typed arrays
and interns names, so memory per event is a few dozen bytes whatever the event's size on disk.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchscalpel.trace.reader import Event

GPU_CATS = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2}
# kind 3: other device-side events HTA counts because they carry a GPU stream (e.g. cuda_sync)
KIND_NAMES = ("kernel", "memcpy", "memset", "sync")
# An event time the analyses accept: finite, a duration of 0..MAX_DUR_US (about 11.6 days, far beyond any
# profiler window) and a timestamp within +-MAX_TS_US (about 31700 years). Anything else (NaN, negative,
# 1e308) is counted in ``invalid_events`` and left out, so it can never become a step of -694342 ms.
MAX_DUR_US = 1e12
MAX_TS_US = 1e18
STEP_RE = re.compile(r"^(?:ProfilerStep|scalpel[.:/]step)\s*#\s*(\d+)$")


@dataclass(slots=True)
class Step:
    """A step annotation on the CPU (``ProfilerStep#N`` or ``scalpel.step#N``)."""

    name: str
    number: int
    start: float
    dur: float
    tid: int


@dataclass
class RankData:
    """Columns of one rank's trace; times in microseconds as written in the trace."""

    names: list[str]
    steps: list[Step]
    # CPU ops (cat cpu_op)
    op_ts: np.ndarray
    op_dur: np.ndarray
    op_tid: np.ndarray
    op_name: np.ndarray
    # GPU activities (kernel, memcpy, memset, sync: see KIND_NAMES)
    gpu_ts: np.ndarray
    gpu_dur: np.ndarray
    gpu_stream: np.ndarray
    gpu_corr: np.ndarray
    gpu_name: np.ndarray
    gpu_kind: np.ndarray
    # CPU-side events that carry a correlation id (kernel launches, memcpy calls)
    launch_corr: np.ndarray
    launch_ts: np.ndarray
    launch_name: np.ndarray
    # allocator events ("[memory]" instant events)
    mem_ts: np.ndarray
    mem_total: np.ndarray
    mem_bytes: np.ndarray
    mem_device: np.ndarray
    mem_tid: np.ndarray
    tids: list[Any] = field(default_factory=list)
    invalid_events: int = 0  # events left out for a time that is NaN, infinite, negative or absurd
    # gloo's collectives (``gloo:all_reduce``, ...): user annotations on gloo's worker threads spanning the
    # exchange, the wait for the other ranks included (the CPU op ``c10d::allreduce_`` only enqueues it)
    coll_ts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    coll_dur: np.ndarray = field(default_factory=lambda: np.zeros(0))


class RankCollector:
    """Feed it batches of :class:`Event`; :meth:`finish` returns :class:`RankData`."""

    def __init__(self) -> None:
        self._names: dict[str, int] = {}
        self._tids: dict[Any, int] = {}
        self.steps: list[Step] = []
        self.op_ts, self.op_dur, self.op_tid, self.op_name = array("d"), array("d"), array("l"), array("l")
        self.gpu_ts, self.gpu_dur, self.gpu_stream = array("d"), array("d"), array("l")
        self.gpu_corr, self.gpu_name, self.gpu_kind = array("d"), array("l"), array("b")
        self.launch_corr, self.launch_ts, self.launch_name = array("d"), array("d"), array("l")
        self.mem_ts, self.mem_total, self.mem_bytes = array("d"), array("d"), array("d")
        self.mem_device, self.mem_tid = array("l"), array("l")
        self.coll_ts, self.coll_dur = array("d"), array("d")
        self.invalid_events = 0

    def _name(self, name: str) -> int:
        i = self._names.get(name)
        if i is None:
            i = self._names[name] = len(self._names)
        return i

    def _tid(self, tid: Any) -> int:
        i = self._tids.get(tid)
        if i is None:
            i = self._tids[tid] = len(self._tids)
        return i

    def feed(self, events: list[Event]) -> None:
        """Append the events the analyses use; others are dropped here."""
        names = self._names
        tids = self._tids
        gpu_cats = GPU_CATS
        op_ts, op_dur, op_tid, op_name = (
            self.op_ts.append,
            self.op_dur.append,
            self.op_tid.append,
            self.op_name.append,
        )
        g_ts, g_dur, g_stream, g_corr = (
            self.gpu_ts.append,
            self.gpu_dur.append,
            self.gpu_stream.append,
            self.gpu_corr.append,
        )
        g_name, g_kind = self.gpu_name.append, self.gpu_kind.append
        l_corr, l_ts, l_name = self.launch_corr.append, self.launch_ts.append, self.launch_name.append
        for e in events:
            ph = e.ph
            if ph == "X":
                ts = e.ts
                dur = e.dur
                if ts is None or dur is None:
                    continue
                if not (0.0 <= dur <= MAX_DUR_US and -MAX_TS_US <= ts <= MAX_TS_US):  # NaN fails both
                    self.invalid_events += 1
                    continue
                cat = e.cat
                name = e.name
                nid = names.get(name)
                if nid is None:
                    nid = self._name(name)
                if cat == "cpu_op":
                    tid = tids.get(e.tid)
                    if tid is None:
                        tid = self._tid(e.tid)
                    op_ts(ts)
                    op_dur(dur)
                    op_tid(tid)
                    op_name(nid)
                    continue
                kind = gpu_cats.get(cat)
                a = e.args
                if kind is None and a is not None and type(a.stream) is int:
                    kind = 3
                if kind is not None:
                    stream = a.stream if a is not None else None
                    g_ts(ts)
                    g_dur(dur)
                    g_stream(stream if isinstance(stream, int) else -1)
                    corr = a.correlation if a is not None else None
                    g_corr(corr if corr is not None else -1.0)
                    g_name(nid)
                    g_kind(kind)
                    continue
                if a is not None and a.correlation is not None and cat != "Trace":
                    l_corr(a.correlation)
                    l_ts(ts)
                    l_name(nid)
                elif cat == "user_annotation" or cat == "":
                    m = STEP_RE.match(name)
                    if m is not None:
                        self.steps.append(Step(name, int(m.group(1)), ts, dur, self._tid(e.tid)))
                    elif name.startswith("gloo:"):
                        self.coll_ts.append(ts)
                        self.coll_dur.append(dur)
            elif (ph == "i" or ph == "I") and e.name == "[memory]":
                a = e.args
                if a is not None and a.total_allocated is not None:
                    ts = e.ts or 0.0
                    if not (
                        -MAX_TS_US <= ts <= MAX_TS_US
                        and abs(a.total_allocated) < 1e30
                        and (a.nbytes is None or abs(a.nbytes) < 1e30)
                    ):
                        self.invalid_events += 1
                        continue
                    self.mem_ts.append(ts)
                    self.mem_total.append(a.total_allocated)
                    self.mem_bytes.append(a.nbytes or 0.0)
                    self.mem_device.append(a.device_type if a.device_type is not None else -1)
                    self.mem_tid.append(self._tid(e.tid))

    def finish(self) -> RankData:
        """Freeze the columns into numpy arrays."""

        def f(a: array) -> np.ndarray:
            return np.frombuffer(a, dtype=np.float64) if a.typecode == "d" else np.asarray(a, dtype=np.int64)

        names = [""] * len(self._names)
        for k, v in self._names.items():
            names[v] = k
        tids = [None] * len(self._tids)
        for k, v in self._tids.items():
            tids[v] = k
        self.steps.sort(key=lambda s: s.start)
        return RankData(
            names=names,
            steps=self.steps,
            op_ts=f(self.op_ts),
            op_dur=f(self.op_dur),
            op_tid=f(self.op_tid),
            op_name=f(self.op_name),
            gpu_ts=f(self.gpu_ts),
            gpu_dur=f(self.gpu_dur),
            gpu_stream=f(self.gpu_stream),
            gpu_corr=f(self.gpu_corr),
            gpu_name=f(self.gpu_name),
            gpu_kind=np.asarray(self.gpu_kind, dtype=np.int8),
            launch_corr=f(self.launch_corr),
            launch_ts=f(self.launch_ts),
            launch_name=f(self.launch_name),
            mem_ts=f(self.mem_ts),
            mem_total=f(self.mem_total),
            mem_bytes=f(self.mem_bytes),
            mem_device=f(self.mem_device),
            mem_tid=f(self.mem_tid),
            tids=tids,
            invalid_events=self.invalid_events,
            coll_ts=f(self.coll_ts),
            coll_dur=f(self.coll_dur),
        )

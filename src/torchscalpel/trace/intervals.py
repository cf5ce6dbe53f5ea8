"""Interval arithmetic on numpy arrays: merge, union length, coverage by overlapping kinds, clipping.

Everything is vectorised (sort + cumulative max / cumulative sum), so a trace with millions of
kernels costs a few sorts, not a Python loop per kernel.
"""

from __future__ import annotations

import numpy as np

Array = np.ndarray


def merge(starts: Array, ends: Array) -> tuple[Array, Array, Array]:
    """Merge overlapping ``[start, end)`` intervals.

    Returns ``(merged_starts, merged_ends, first)`` where ``first[i]`` is the index (into the inputs)
    of the interval that opens merged interval ``i`` (the earliest-starting one).
    """
    if len(starts) == 0:
        empty = np.zeros(0)
        return empty, empty, np.zeros(0, dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = ends[order]
    run_end = np.maximum.accumulate(e)
    # a new group opens where an interval starts after every earlier one ended (HTA: ts > cummax(end))
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    last = np.append(idx[1:] - 1, len(s) - 1)
    return s[idx], run_end[last], order[idx]


def union_length(starts: Array, ends: Array) -> float:
    """Total time covered by at least one interval."""
    ms, me, _ = merge(starts, ends)
    return float((me - ms).sum())


def clipped_length(ms: Array, me: Array, lo: float, hi: float) -> float:
    """Length of merged (sorted, disjoint) intervals inside ``[lo, hi)``."""
    if len(ms) == 0 or hi <= lo:
        return 0.0
    i0 = int(np.searchsorted(me, lo, side="right"))
    i1 = int(np.searchsorted(ms, hi, side="left"))
    if i1 <= i0:
        return 0.0
    s = np.clip(ms[i0:i1], lo, hi)
    e = np.clip(me[i0:i1], lo, hi)
    return float((e - s).sum())


class Coverage:
    """Time covered by each combination of interval kinds (a bit mask per kind), as a sweep line.

    ``Coverage([(s0, e0), (s1, e1)])`` splits time into segments on which the set of running kinds is
    constant; :meth:`totals` sums segment lengths per mask, optionally inside a window.
    """

    def __init__(self, kinds: list[tuple[Array, Array]]) -> None:
        times: list[Array] = []
        deltas: list[Array] = []
        for bit, (s, e) in enumerate(kinds):
            ms, me, _ = merge(s, e)  # merge per kind so the mask counts each kind once
            times += [ms, me]
            deltas += [
                np.full(len(ms), 1 << bit, dtype=np.int64),
                np.full(len(me), -(1 << bit), dtype=np.int64),
            ]
        self.nmasks = 1 << len(kinds)
        if not times or sum(len(t) for t in times) == 0:
            self.seg_start = self.seg_end = np.zeros(0)
            self.mask = np.zeros(0, dtype=np.int64)
            return
        t = np.concatenate(times)
        d = np.concatenate(deltas)
        order = np.argsort(t, kind="stable")
        t = t[order]
        running = np.cumsum(d[order])
        self.seg_start = t[:-1]
        self.seg_end = t[1:]
        self.mask = running[:-1]

    def totals(self, lo: float | None = None, hi: float | None = None) -> Array:
        """Microseconds covered per mask (index = mask), inside ``[lo, hi)`` when given."""
        if len(self.mask) == 0:
            return np.zeros(self.nmasks)
        if lo is None or hi is None:
            return np.bincount(self.mask, weights=self.seg_end - self.seg_start, minlength=self.nmasks)
        i0 = int(np.searchsorted(self.seg_end, lo, side="right"))
        i1 = int(np.searchsorted(self.seg_start, hi, side="left"))
        if i1 <= i0:
            return np.zeros(self.nmasks)
        s = np.clip(self.seg_start[i0:i1], lo, hi)
        e = np.clip(self.seg_end[i0:i1], lo, hi)
        return np.bincount(self.mask[i0:i1], weights=e - s, minlength=self.nmasks)

"""Reading pickles nobody vetted (memory snapshots, NCCL flight-recorder dumps, DCP metadata) as plain data.

Memory snapshots and NCCL dumps are pickles of dicts, lists, strings and numbers. A file the user did not
write is not trusted to run code, so :class:`PlainUnpickler` refuses every global lookup (the opcodes that
import a class or a function) and every persistent id: what it builds can only be containers and numbers.

Refusing code is not enough: a pickle's memo lets a file name one object again and again for two bytes
each, so a 0.2 MB file can stand for 10^10 objects to whoever walks what it built (a memo bomb). Every
reader here therefore counts by one rule, :func:`work_budget` and :class:`WorkCounter`: a walk spends a
unit on each part it reaches, and a part reached again through a second reference (a memo fetch) is
counted again, with its whole content; past the budget, a multiple of the file's size that no file torch
wrote comes near, the reader raises :class:`TooMuchWork` and the caller refuses the file in one sentence.
:func:`spend_expanded` is that walk for any plain object; the snapshot summary spends as it walks
(``memory/snapshot.py``, and its C twin).

:class:`SignalCheckingReader`: the C unpickler never looks at signals while it runs, so Ctrl-C during a
long load took effect only after it (or, read through a ``BufferedReader`` over another one, never); it
reads its input through this wrapper's Python methods, each a point where Ctrl-C is raised.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterable
from typing import Any

WORK_PER_BYTE = 4
"""What a reader may walk per byte of the file. A file torch wrote walks about one unit per 10 bytes: every
block, event, chunk or entry is an object of its own (tens of bytes), and every second reference costs at
least a 2-byte memo fetch."""
WORK_BASE = 1_000_000
"""What a reader may walk whatever the file's size (small files with a few shared objects)."""


def work_budget(file_size: int) -> int:
    """The most parts any reader here walks for a file of ``file_size`` bytes (memo references counted again).

    Beyond it the file is refused: only a memo that names the same parts again and again (a memo bomb: 0.4 MB
    naming one segment of 10^5 blocks 10^5 times) gets there.
    """
    return WORK_PER_BYTE * max(file_size, 0) + WORK_BASE


class TooMuchWork(Exception):
    """The file asked for more than its budget (a memo bomb); ``args[0]`` is the budget."""

    @property
    def budget(self) -> int:
        """The budget that was exceeded."""
        return int(self.args[0])


class WorkCounter:
    """Units spent so far against ``budget`` (None: no limit, for data built in memory)."""

    __slots__ = ("budget", "work")

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.work = 0

    def spend(self, units: int) -> None:
        """Count ``units``; :class:`TooMuchWork` once the total passes the budget."""
        self.work += units
        if self.budget is not None and self.work > self.budget:
            raise TooMuchWork(self.budget)


def plain_children(obj: Any) -> Iterable[Any] | None:
    """What a plain container holds (dict keys and values); None for anything else."""
    if isinstance(obj, dict):
        return (x for kv in obj.items() for x in kv)
    if isinstance(obj, list | tuple | set | frozenset):
        return obj
    return None


def spend_expanded(
    obj: Any, counter: WorkCounter, children: Callable[[Any], Iterable[Any] | None] = plain_children
) -> None:
    """Spend one unit on ``obj`` and on every part reached from it, each time it is reached.

    A list referred to 1000 times costs 1000 times its content, as it does whoever walks the result; a cycle
    costs until the budget is spent. Iterative (a deep pickle is fine); what it walks is bounded by the
    counter's budget. ``children(x)``: what ``x`` holds, None for a leaf (plain containers by default).
    """
    stack: list[Iterable[Any]] = [(obj,)]
    spend = counter.spend
    while stack:
        for x in stack.pop():
            spend(1)
            inner = children(x)
            if inner is not None:
                stack.append(inner)


class Refused(pickle.UnpicklingError):
    """The pickle asked for a global or a persistent id; the message names which."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that refuses every class, function and persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        raise Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise Refused("a persistent id")


class SignalCheckingReader:
    """``fh`` read through Python methods, so that Ctrl-C raises inside a C unpickler's load.

    The C unpickler runs no Python code between its reads (a signal waits until ``load()`` returns: seconds
    for a large file). Each call here is Python code, where the interpreter raises a pending
    ``KeyboardInterrupt``, and the unpickler passes it on. It asks for at most a 64 KiB frame or a 128 KiB
    look-ahead at a time (pickle's ``PREFETCH``), so a 1 GB file makes some 10^4 calls: no measurable cost.
    """

    def __init__(self, fh: io.BufferedIOBase) -> None:
        self._fh = fh
        self._peek = getattr(fh, "peek", None)

    def read(self, n: int = -1) -> bytes:
        """``fh.read(n)``."""
        return self._fh.read(n)

    def readinto(self, buffer: Any) -> int:
        """``fh.readinto(buffer)``."""
        return self._fh.readinto(buffer)

    def readline(self) -> bytes:
        """``fh.readline()``."""
        return self._fh.readline()

    def peek(self, n: int = 0) -> bytes:
        """``fh.peek(n)`` (what the unpickler prefetches without a frame)."""
        if self._peek is None:
            raise NotImplementedError  # the unpickler then reads what it needs, no more
        return bytes(self._peek(n))

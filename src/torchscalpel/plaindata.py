"""Unpickling files torch writes for tools to read (memory snapshots, NCCL flight-recorder dumps) as plain data.

Both are pickles of dicts, lists, strings and numbers. A file the user did not write is not trusted to
run code, so :class:`PlainUnpickler` refuses every global lookup (the opcodes that import a class or a
function) and every persistent id: what it builds can only be containers and numbers.
"""

from __future__ import annotations

import pickle
from typing import Any


class Refused(pickle.UnpicklingError):
    """The pickle asked for a global or a persistent id; the message names which."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that refuses every class, function and persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        raise Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise Refused("a persistent id")

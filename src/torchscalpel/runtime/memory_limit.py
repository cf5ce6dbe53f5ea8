"""``--memory-limit SIZE``: the exception that ends a run whose live tensors go over the limit.

A ``BaseException`` (as the runtime's own stop is), so a script's ``except Exception`` / ``except
RuntimeError`` retry blocks cannot swallow it and keep running past the limit: the run stops at the
allocation that crossed it, and the record says what was live.
"""

from __future__ import annotations


class MemoryLimitExceeded(BaseException):
    """Live tensor memory went over ``--memory-limit``; the message is one sentence."""


def requested_bytes(message: str) -> int | None:
    """``Tried to allocate 2.00 GiB`` in a CUDA out-of-memory message, in bytes."""
    import re

    m = re.search(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", message)
    if not m:
        return None
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[m.group(2)]
    return int(float(m.group(1)) * scale)

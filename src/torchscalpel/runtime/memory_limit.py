"""``--memory-limit SIZE``: the exception that ends a run whose live tensors go over the limit.

A ``BaseException`` (as the runtime's own stop is), so a script's ``except Exception`` / ``except
RuntimeError`` retry blocks cannot swallow it and keep running past the limit: the run stops at the
allocation that crossed it, and the record says what was live.
"""

from __future__ import annotations


class MemoryLimitExceeded(BaseException):
    """Live tensor memory went over ``--memory-limit``; the message is one sentence."""

"""Third-party native noise (Kineto's ``USDT: ... profiler_start`` lines, c10's CPUAllocator warning)
goes to the run folder's log file instead of the user's terminal.

Those lines are written by C++ straight to file descriptor 2, so ``sys.stderr`` redirection cannot
catch them: :func:`native_stderr_to` points fd 2 at the log for the duration of a call (the profiler's
start and stop) and restores it afterwards. Python-level writes in that window are flushed first, so
nothing of the script's own output is lost or reordered.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

LOG_NAME = "scalpel.log"
"""The run folder's log of third-party output captured around the profiler."""


@contextlib.contextmanager
def native_stderr_to(log_path: Path | None) -> Iterator[None]:
    """Append everything written to fd 2 inside the block to ``log_path``; a no-op when it is None or
    fd 2 cannot be duplicated (an embedding host without file descriptors)."""
    if log_path is None:
        yield
        return
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        os.close(log_fd)
        yield
        return
    try:
        os.dup2(log_fd, 2)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log_fd)

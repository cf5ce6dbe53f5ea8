"""A competing CPU load for measurements and tests that must hold on a busy machine.

``benchmarks/`` is on pytest's ``pythonpath`` (pyproject), so ``tests/integration`` imports this module as
``cpu_load`` and ``benchmarks/doctor_recall.py`` imports it beside itself: one spinner for both.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

SPIN = "import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n    pass\n"
"""A busy loop that ends with the process that started it (a run killed by its timeout skips its finally and
would otherwise leave the cores busy)."""


@contextlib.contextmanager
def competing_load(processes: int | None = None) -> Iterator[int]:
    """``processes`` busy-looping processes (default: one per core) until the block ends; yields how many.

    They are killed in the ``finally``; should the starting process die first, each ends by itself."""
    n = (os.cpu_count() or 2) if processes is None else processes
    procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())]) for _ in range(n)]
    try:
        yield n
    finally:
        for p in procs:
            p.kill()
            p.wait()

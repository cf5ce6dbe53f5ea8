"""Time a script's optimizer steps under plain python: the clock ``scalpel fix --verify`` reads.

Run by path, never imported by the script it times::

    python steptimer.py OUT.json WARMUP STEPS SCRIPT [ARGS ...]

It imports nothing of torchscalpel (no hooks, no observers, no profiler): it registers one global
``torch.optim.optimizer.register_optimizer_step_post_hook``, runs SCRIPT as ``__main__`` with
``runpy`` (``sys.argv`` and ``sys.path[0]`` as plain ``python SCRIPT`` sets them), and reads
``time.perf_counter()`` after every ``optimizer.step()`` (after a ``torch.cuda.synchronize()`` when
CUDA is in use, so that queued kernels are counted in the step that queued them). The step time is
the interval between two consecutive optimizer steps: the whole training step (data, forward,
backward, step), which is what tune's step time measures. After WARMUP + STEPS + 1 steps it writes
OUT.json (``{"step_ms": [...], "steps_seen": N}``) and leaves at once (``os._exit(0)``, like the
runtime's stop at a step boundary); a script that ends sooner gets its intervals written at exit.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import runpy
import sys
import time
from typing import Any


def main(argv: list[str]) -> None:
    """Time the script named in ``argv`` (see the module doc)."""
    out, warmup, steps, script, *args = argv
    stop_after = int(warmup) + int(steps) + 1
    stamps: list[float] = []
    written = False

    def write() -> None:
        nonlocal written
        if written:
            return
        written = True
        intervals = [(b - a) * 1000.0 for a, b in itertools.pairwise(stamps)]
        measured = intervals[int(warmup) :]
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"step_ms": measured, "steps_seen": len(stamps)}, f)

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def after_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        if len(stamps) >= stop_after:
            write()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # the rest of the run is not measured: stop as the runtime stops a script

    register_optimizer_step_post_hook(after_step)
    atexit.register(write)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` sets it, not this folder
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])

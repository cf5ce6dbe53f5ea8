"""Time a script's optimizer steps under plain python: the clock ``scalpel fix --verify`` reads.

Run by path, never imported by the script it times::

    python steptimer.py OUT.json WARMUP STEPS SCRIPT [ARGS ...]

It imports nothing of torchscalpel (no observers, no profiler): it registers torch's global
optimizer-step pre and post hooks, wraps ``Tensor.backward`` / ``torch.autograd.backward`` and
``GradScaler.scale`` to keep the first steps' losses (below), runs SCRIPT as ``__main__`` with
``runpy`` (``sys.argv`` and ``sys.path[0]`` as plain ``python SCRIPT`` sets them), and reads
``time.perf_counter()`` after every ``optimizer.step()`` (after a ``torch.cuda.synchronize()`` when
CUDA is in use, so that queued kernels are counted in the step that queued them). The step time is
the interval between two consecutive optimizer steps: the whole training step (data, forward,
backward, step), which is what tune's step time measures. After WARMUP + STEPS + 1 steps it writes
OUT.json (``{"step_ms": [...], "steps_seen": N, "losses": [...]}``) and leaves at once
(``os._exit(0)``, like the runtime's stop at a step boundary); a script that ends sooner gets its
intervals written at exit.

The losses are what ``--verify`` compares between the original and the patched script: each of the
first LOSS_STEPS steps' loss, defined as the runtime defines it (``runtime/timeline.note_loss``): the
sum of the scalar tensors ``backward()`` ran on between two optimizer steps (the micro-batches of an
accumulating loop), the first evaluation only inside a closure, divided by the GradScaler's scale when
the tensor came from ``scaler.scale(loss)``. They are kept as detached device tensors (no sync inside
the timed steps) and read when OUT.json is written.
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

LOSS_STEPS = 10
"""Steps whose losses are kept: tune's numerics gate compares the first ten
(``torchscalpel.tune.verify.GATE_STEPS``; this file imports nothing of torchscalpel, a unit test keeps
the two equal)."""


def main(argv: list[str]) -> None:
    """Time the script named in ``argv`` (see the module doc)."""
    out, warmup, steps, script, *args = argv
    stop_after = int(warmup) + int(steps) + 1
    stamps: list[float] = []
    written = False
    losses: list[list[Any]] = [[]]  # the open step's backward losses last
    in_step = [False]  # inside optimizer.step(): a closure's backward
    depth = [0]  # Tensor.backward calls torch.autograd.backward: one loss, counted once

    def write() -> None:
        nonlocal written
        if written:
            return
        written = True
        intervals = [(b - a) * 1000.0 for a, b in itertools.pairwise(stamps)]
        measured = intervals[int(warmup) :]
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"step_ms": measured, "steps_seen": len(stamps), "losses": _floats(losses)}, f)

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    scales: dict[int, Any] = {}  # id(scaled loss) -> the scale it was multiplied by

    def note_loss(tensors: Any) -> None:
        t = tensors[0] if isinstance(tensors, list | tuple) and tensors else tensors
        if len(losses) > LOSS_STEPS or not isinstance(t, torch.Tensor):
            return
        if in_step[0] and losses[-1]:
            return  # a closure evaluated again inside the step: only its first loss counts
        factor = scales.pop(id(t), None)
        scales.clear()  # ids of freed tensors must not match later ones
        value = t.detach().float().sum() if t.numel() == 1 else None
        losses[-1].append(value / factor if value is not None and factor is not None else value)

    def wrap_backward(original: Any) -> Any:
        def backward(*a: Any, **k: Any) -> Any:
            depth[0] += 1
            try:
                result = original(*a, **k)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                note_loss(a[0] if a else k.get("tensors", k.get("self")))
            return result

        return backward

    def wrap_scale(original: Any) -> Any:
        def scale(scaler: Any, outputs: Any) -> Any:
            result = original(scaler, outputs)
            factor = getattr(scaler, "_scale", None)
            if isinstance(result, torch.Tensor) and isinstance(factor, torch.Tensor):
                scales[id(result)] = factor.detach().clone()
            return result

        return scale

    torch.Tensor.backward = wrap_backward(torch.Tensor.backward)  # type: ignore[method-assign]
    torch.autograd.backward = wrap_backward(torch.autograd.backward)
    torch.amp.GradScaler.scale = wrap_scale(torch.amp.GradScaler.scale)  # type: ignore[method-assign]

    def before_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        in_step[0] = True

    def after_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        in_step[0] = False
        if len(losses) <= LOSS_STEPS:
            losses.append([])
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        if len(stamps) >= stop_after:
            write()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # the rest of the run is not measured: stop as the runtime stops a script

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)
    atexit.register(write)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` sets it, not this folder
    runpy.run_path(script, run_name="__main__")


def _floats(losses: list[list[Any]]) -> list[float | None]:
    """Each closed step's loss as a float (None: no scalar loss seen in that step)."""
    out: list[float | None] = []
    for step in losses[:-1][:LOSS_STEPS]:  # the last list is the step still open
        values = [v for v in step if v is not None]
        out.append(float(sum(float(v) for v in values)) if values and len(values) == len(step) else None)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])

"""The runtime's dispatch modes (the FLOP-counting step, the allocation tracker, doctor's NaN tracer) must not leave a
``torch.compile``'d function running eagerly after they end.

Under a non-infra dispatch mode dynamo refuses a compiled frame and marks its code object "skip" for the
rest of the process; ``scalpel profile`` then measured every step after the FLOP-counting one eagerly
(runtime.dynamo_skip.force_eager keeps dynamo away from the frame while a mode is on)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchscalpel.record import StepRecord
from torchscalpel.runtime.alloc_tracker import AllocationTracker
from torchscalpel.runtime.flop_count import StepFlopCounter


def _compiled() -> tuple[Callable[[torch.Tensor], torch.Tensor], list[int]]:
    """A function compiled with a backend that counts how often its compiled code runs."""
    runs: list[int] = []

    def backend(gm: torch.fx.GraphModule, example: Any) -> Any:
        def run(*args: Any) -> Any:
            runs.append(1)
            return gm(*args)

        return run

    def body(x: torch.Tensor) -> torch.Tensor:  # a fresh code object per test: skip marks live on code
        return (x * 2).sin()

    torch._dynamo.reset()
    return torch.compile(body, backend=backend), runs


def _flop_step() -> tuple[Callable[[], None], Callable[[], None]]:
    counter = StepFlopCounter(0)  # index 0: counting starts at once
    return (lambda: None), (lambda: counter.on_step_closed(StepRecord(index=0)))


def _tracker() -> tuple[Callable[[], None], Callable[[], None]]:
    tracker = AllocationTracker()
    return tracker.start, tracker.stop


def _nan_tracer() -> tuple[Callable[[], None], Callable[[], None]]:
    from torchscalpel.doctor.nan_trace import NanOpTracer

    tracer = (
        NanOpTracer()
    )  # doctor's re-run that finds the first op making NaN (the in-process API reruns too)
    return (lambda: tracer.on_start(None)), (lambda: tracer.on_finish(None))


@pytest.mark.parametrize(
    "mode",
    [_flop_step, _tracker, _nan_tracer],
    ids=["flop-counting-step", "allocation-tracker", "nan-tracer"],
)
def test_compiled_code_runs_again_after_the_mode(mode):
    fn, runs = _compiled()
    x = torch.randn(8)
    fn(x)
    assert len(runs) == 1
    start, stop = mode()
    start()
    try:
        eager = fn(x)  # under the mode the function runs eagerly (the mode sees its ops)
    finally:
        stop()
    assert len(runs) == 1 and torch.equal(eager, (x * 2).sin())
    fn(x)
    fn(x)
    assert len(runs) == 3, f"the compiled code ran {len(runs)} of 3 calls: the mode left the function eager"
    assert torch.compiler.is_compiling() is False

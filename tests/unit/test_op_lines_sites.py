"""The op-line pass on a real (CPU) profile: each op is charged to the user's line that ran it, a backward op
to its forward op's line, and the pass's steps are marked and left out."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch

from torchscalpel.record import StepRecord
from torchscalpel.runtime.op_lines import OpLinePass


@pytest.fixture(autouse=True)
def _no_compiled_code_in_this_process():
    """The pass leaves its mode out once this process has built any torch.compile graph (the mode would make
    dynamo recompile it). A test that compiled earlier in the same pytest worker (test_compiled_under_modes, an
    in-process API test) would make these tests see a compiled process: start from dynamo's fresh state."""
    if "torch._dynamo" in sys.modules:
        import torch._dynamo
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
    yield


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def train_step(model: torch.nn.Linear, x: torch.Tensor) -> float:
    scores = x @ model.weight.t()
    loss = scores.softmax(-1).sum()
    loss.backward()
    return loss.item()


def test_ops_are_charged_to_the_line_that_ran_them():
    model, x = torch.nn.Linear(16, 16), torch.randn(4, 16, requires_grad=True)
    train_step(model, x)
    p = OpLinePass(1, 0, None)
    p.start()
    train_step(model, x)
    step = StepRecord(index=0, total_ms=10.0)
    assert p.on_step_closed(step) and p.error is None
    assert step.profiled and step.op_lines and p.seconds and p.seconds > 0
    here = __file__
    matmul, item = _line_of(train_step, "x @ model.weight"), _line_of(train_step, "loss.item()")
    sites = {o["name"]: o["site"] for o in p.ops}
    assert sites["aten::_local_scalar_dense"] == f"{here}:{item}"
    # forward mm and its backward mm both at the matmul line, not at loss.backward()
    assert sites["aten::mm"] == f"{here}:{matmul}"
    mm = next(o for o in p.ops if o["name"] == "aten::mm")
    assert mm["calls"] >= 2 and mm["site_share"] == 1.0
    assert sites["aten::_softmax_backward_data"] == f"{here}:{matmul + 1}"

"""FlopCountMode against torch's FlopCounterMode on one training step: equal totals in fp32 and under bf16
autocast; under checkpointing, model FLOPs apart from the recomputed forward's."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from torchscalpel.runtime.flop_count import FlopCountMode


class _Net(nn.Module):
    def __init__(self, reentrant: bool | None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 256)) for _ in range(2)
        )
        self.head = nn.Linear(256, 10)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).flatten(1)
        for block in self.blocks:
            h = block(h) if self.reentrant is None else checkpoint(block, h, use_reentrant=self.reentrant)
        return self.head(h)


def _step(model: nn.Module, opt: torch.optim.Optimizer, amp: bool) -> None:
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "reentrant", [None, False, True], ids=["plain", "checkpoint", "checkpoint-reentrant"]
)
def test_counts_equal_flop_counter_mode_with_recompute_apart(amp, reentrant):
    torch.manual_seed(0)
    model = _Net(reentrant)
    opt = torch.optim.Adam(model.parameters())
    _step(model, opt, amp)
    with FlopCounterMode(display=False) as theirs:
        _step(model, opt, amp)
    mine = FlopCountMode()
    with mine:
        _step(model, opt, amp)
    model_flops = sum(r["flops"] for r in mine.by_op())
    recompute = sum(r["recompute"] for r in mine.by_op())
    assert model_flops + recompute == theirs.get_total_flops()
    plain = _Net(None)
    plain_opt = torch.optim.Adam(plain.parameters())
    _step(plain, plain_opt, amp)
    with FlopCounterMode(display=False) as unchecked:
        _step(plain, plain_opt, amp)
    assert model_flops == unchecked.get_total_flops()  # recomputation is not model FLOPs
    # reentrant checkpointing re-runs both blocks' matmuls; non-reentrant stops once the saved tensors
    # backward needs are back (the first Linear of each block)
    block = 2 * 8 * 256 * 64
    assert recompute == {None: 0, False: 2 * block, True: 4 * block}[reentrant]
    assert mine.ops > 0 and any(r["name"] == "aten::convolution_backward" for r in mine.by_op())


_LIB = torch.library.Library("scalpel_flop_test", "DEF")
_LIB.define("scaled(Tensor x, Tensor w) -> Tensor")
# Its own CPU kernel and a composite decomposition that round apart on purpose (x @ w against
# (x @ w) + 1e-3): the way silu_backward's fused kernel and its decomposition differ in the last bit.
_LIB.impl("scaled", lambda x, w: x @ w, "CPU")
_LIB.impl("scaled", lambda x, w: torch.mm(x, w) + 1e-3, "CompositeImplicitAutograd")


def test_a_composite_op_computes_with_its_own_kernel_and_counts_its_decomposition():
    """The counting step computes what the plain step computes (issue 44: profiling moved a Llama's
    gradients by an ulp when silu_backward ran decomposed), yet counts the decomposition's FLOPs."""
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with torch.inference_mode():  # below autograd, where the composite kernel is not taken first
        plain = torch.ops.scalpel_flop_test.scaled(x, w)
        mode = FlopCountMode()
        with mode:
            counted = torch.ops.scalpel_flop_test.scaled(x, w)
        with FlopCounterMode(display=False) as theirs:
            torch.ops.scalpel_flop_test.scaled(x, w)
    assert torch.equal(counted, plain)
    assert sum(r["flops"] for r in mode.by_op()) == theirs.get_total_flops() == 2 * 4 * 8 * 3
    assert mode.ops == 1  # the meta decomposition is not a dispatched op of the step

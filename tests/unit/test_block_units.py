"""scalpel plan prices exactly the FSDP units torchscalpel.distributed.wrap shards (one block definition)."""

from __future__ import annotations

import pytest
from torch import nn
from torch.distributed.fsdp import FSDPModule

from block_models import MinGPT, NanoGPT, ResNetLike, tiny_llama
from torchscalpel import distributed as sd
from torchscalpel.plan.simulate import OptimizerSpec, SimSettings, build_meta_model, simulate
from torchscalpel.plan.spec import parse_batch_spec


def _seq_of_blocks() -> nn.Module:
    from block_models import MinBlock

    return nn.Sequential(nn.Linear(16, 16), MinBlock(16), MinBlock(16), nn.Linear(16, 4))


def _stack_of_sequentials() -> nn.Module:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(
                [nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)) for _ in range(3)]
            )
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            for layer in self.layers:
                x = x + layer(x)
            return self.head(x)

    return Net()


MODELS = {
    "mingpt": (MinGPT, "idx=int64[2,8]:50", 3),
    "nanogpt": (NanoGPT, "idx=int64[2,8]:500", 2),
    "llama": (tiny_llama, "input_ids=int64[1,8]:64,labels=int64[1,8]:64", 2),
    "sequential": (_seq_of_blocks, "x=float32[2,4,16]", 2),
    "resnet": (ResNetLike, "x=float32[2,3,8,8],y=int64[2]:10", 4),
    "stack-of-sequentials": (_stack_of_sequentials, "x=float32[4,8],y=int64[4]:2", 3),
    "nothing-repeats": (lambda: nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3)), "x=float32[2,3]", 0),
}


@pytest.mark.parametrize("key", list(MODELS))
def test_plan_fsdp_units_are_the_units_dist_wrap_shards(single_rank, key):
    factory, spec, expected = MODELS[key]
    planned = simulate(
        lambda: build_meta_model(factory, "fp32"),
        parse_batch_spec(spec),
        SimSettings(optimizer=OptimizerSpec.named("sgd")),
        steps=1,
    )
    plan_units = [name for name, _ in planned.blocks]
    wrapped = sd.wrap(factory(), "fsdp")
    sharded = [name for name, m in wrapped.named_modules() if isinstance(m, FSDPModule) and m is not wrapped]
    assert plan_units == sharded
    assert len(sharded) == expected
    assert isinstance(wrapped, FSDPModule)  # and the root, for the parameters outside the blocks

"""wrap(): block detection, SyncBatchNorm decision, unused-parameter measurement, refusals."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchscalpel import distributed as sd
from torchscalpel.distributed.wrapping import choose_strategy, sync_batchnorm_decision, unused_parameters
from torchscalpel.errors import UsageError


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.norm = nn.Linear(8, 8), nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(self.norm(x))))


class Net(nn.Module):
    def __init__(self, n_blocks: int = 3, head_out: int = 64) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(n_blocks))
        self.head = nn.Linear(8, head_out)  # big enough that Linear holds the most parameters overall

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def test_find_blocks_prefers_outermost_repeated_class():
    net = Net(head_out=4096)
    blocks = sd.find_blocks(net)
    assert blocks == list(net.blocks)


def test_find_blocks_flat_mlp_and_nothing_repeated():
    mlp = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    assert sd.find_blocks(mlp) == [mlp[0], mlp[2], mlp[4]]
    assert sd.find_blocks(nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))) == []


def test_sync_batchnorm_decision():
    bn = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    assert sync_batchnorm_decision(nn.Linear(3, 3), torch.device("cuda", 0))[0] is False
    convert, why = sync_batchnorm_decision(bn, torch.device("cpu"))
    assert convert is False and "only runs on CUDA" in why
    assert sync_batchnorm_decision(bn, torch.device("cuda", 0))[0] is True


def test_choose_strategy():
    assert choose_strategy(Net(), 1, torch.device("cpu"))[0] == "none"
    assert choose_strategy(Net(), 2, torch.device("cpu"))[0] == "ddp"


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.bn(self.used(x)))


def test_unused_parameters_measured_without_side_effects():
    torch.manual_seed(0)
    model = Branchy()
    x = torch.randn(6, 4)
    before_rng = torch.get_rng_state()
    before_buffers = {k: v.clone() for k, v in model.named_buffers()}
    assert unused_parameters(model, x) == ["unused.weight", "unused.bias"]
    assert torch.equal(torch.get_rng_state(), before_rng)
    assert all(torch.equal(v, before_buffers[k]) for k, v in model.named_buffers())
    assert all(p.grad is None for p in model.parameters())
    assert unused_parameters(nn.Linear(4, 2), torch.randn(3, 4)) == []


def test_refuses_optimizer_built_before_wrap(single_rank):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UsageError, match="built before wrap"):
        sd.wrap(model, "none")
    del opt


def test_unknown_strategy(single_rank):
    with pytest.raises(UsageError, match="strategy='zero3'"):
        sd.wrap(Net(), "zero3")


def test_checkpointing_and_compile_keep_names_and_gradients(single_rank):
    torch.manual_seed(1)
    plain = Net()
    wrapped = Net()
    wrapped.load_state_dict(plain.state_dict())
    keys = list(plain.state_dict())
    wrapped = sd.wrap(wrapped, "none", activation_checkpointing=True, compile={"backend": "eager"})
    assert list(wrapped.state_dict()) == keys  # no _checkpoint_wrapped_module / _orig_mod
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in wrapped.blocks)
    x = torch.randn(5, 4)
    plain(x).square().sum().backward()
    wrapped(x).square().sum().backward()
    for (name, p), q in zip(plain.named_parameters(), wrapped.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_mixed_precision_without_sharding_autocasts(single_rank):
    model = sd.wrap(nn.Linear(4, 4), "none", mixed_precision="bf16")
    assert model(torch.randn(2, 4)).dtype == torch.bfloat16
    with pytest.raises(UsageError, match="mixed_precision"):
        sd.wrap(nn.Linear(4, 4), "none", mixed_precision="fp8")

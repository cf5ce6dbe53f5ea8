"""2-rank parity: DDP and FSDP2 training equal single-process training on the same global batch.

Every rank also trains a plain copy on the whole global batch; rank 0 writes the largest
parameter difference per strategy to OUT (JSON).
"""

from __future__ import annotations

import copy
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from torchscalpel import distributed as sd


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), Block(16), Block(16), Block(16), nn.Linear(16, 3))


def train(model, opt, xs, ys):
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def main() -> None:
    out = sys.argv[1]
    ctx = sd.setup(seed=0)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(8, 6, generator=g) for _ in range(4)]
    ys = [torch.randint(0, 3, (8,), generator=g) for _ in range(4)]
    reference = make_model()
    train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2), xs, ys)
    result = {}
    for strategy in ("ddp", "fsdp"):
        model = sd.wrap(copy.deepcopy(make_model()), strategy)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        shard = slice(ctx.rank * 4, (ctx.rank + 1) * 4)
        train(model, opt, [x[shard] for x in xs], [y[shard] for y in ys])
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        ref = reference.state_dict()
        assert set(full) == set(ref), sorted(set(full) ^ set(ref))
        result[strategy] = max((full[k] - ref[k]).abs().max().item() for k in ref)
    # A NaN on rank 1 only: the guard must skip the update on both ranks (FSDP-sharded gradients).
    model = sd.wrap(copy.deepcopy(make_model()), "fsdp")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = sd.NonFiniteGuard(model, mode="skip")
    x = xs[0][:4].clone()
    if ctx.rank == 1:
        x[0, 0] = float("nan")
    loss = F.cross_entropy(model(x), ys[0][:4])
    loss.backward()
    stepped = guard.step(opt, loss)
    flags = [None] * ctx.world_size
    torch.distributed.all_gather_object(flags, stepped)
    result["guard_stepped"] = flags
    if ctx.is_main:
        with open(out, "w") as fh:
            json.dump(result, fh)
    sd.teardown()


if __name__ == "__main__":
    main()

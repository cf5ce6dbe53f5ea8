"""Healthy 2-rank training loop for benchmarks/check_collectives.py: a small MLP whose gradients are
all-reduced one parameter at a time (six collectives per step, the worst case for per-call logging),
plus a loss all-reduce; rank 0 writes each step's wall time to argv[1]."""

import json
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = int(sys.argv[2])
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
    dist.all_reduce(loss.detach())
    times.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as fh:
        json.dump(times, fh)
dist.destroy_process_group()

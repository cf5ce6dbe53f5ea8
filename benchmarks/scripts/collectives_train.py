"""Healthy 2-rank training loop for benchmarks/check_collectives.py: a small MLP whose gradients are
all-reduced one parameter at a time (six collectives per step, the worst case for per-call logging),
plus a loss all-reduce. Rank 0 writes each step's wall time and CPU time (all of its threads: gloo's
workers too) to argv[1] as [[logged, seconds, cpu seconds], ...].

Under ``scalpel launch`` the collectives are wrapped; the unwrapped function is ``__wrapped__``.
Steps alternate between the two (odd steps logged: the same process, the same moment), so the
logging's cost is measured without the noise between separate runs on a shared CPU; a load spike
lasting longer than a step falls on both kinds alike."""

import json
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 128),
    torch.nn.ReLU(),
    torch.nn.Linear(128, 128),
    torch.nn.ReLU(),
    torch.nn.Linear(128, 1),
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = int(sys.argv[2])
logged_fn = dist.all_reduce
plain_fn = getattr(logged_fn, "__wrapped__", logged_fn)
times = []
for step in range(steps):
    logged = step % 2 == 1 and plain_fn is not logged_fn
    all_reduce = logged_fn if logged else plain_fn
    t0, c0 = time.perf_counter(), time.process_time()
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
    all_reduce(loss.detach())
    times.append([logged, time.perf_counter() - t0, time.process_time() - c0])
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as fh:
        json.dump(times, fh)
dist.destroy_process_group()

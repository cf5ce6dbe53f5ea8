"""Overhead workload: an MLP trained with ``optimizer.step(closure)`` (the LBFGS / Lightning shape).

Prints one ``loss`` line per step so benchmarks/overhead.py can time it from outside.
"""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
args = parser.parse_args()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
for step in range(args.steps):

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    loss = opt.step(closure)
    print(f"step {step} loss {loss.item():.4f}")

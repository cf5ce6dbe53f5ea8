"""A plain training loop over one corpus model, with a warm-up LambdaLR (what scalpel lr suspends).

python plain.py {mlp,cnn,lm} [--epochs N] [--batches N]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import models
import torch

parser = argparse.ArgumentParser()
parser.add_argument("kind", choices=["mlp", "cnn", "lm"])
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batches", type=int, default=100)
args = parser.parse_args()

torch.set_num_threads(1)
model = models.build(args.kind)
optimizer = models.make_optimizer(args.kind, model.parameters())
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 50))
for epoch in range(args.epochs):
    for batch in models.loader(args.kind, args.batches):
        optimizer.zero_grad()
        loss = models.loss_of(args.kind, model, batch)
        loss.backward()
        optimizer.step()
        scheduler.step()
    print(f"epoch {epoch}: loss {loss.item():.4f}")

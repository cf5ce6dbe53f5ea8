"""A small CNN on scikit-learn's bundled handwritten digits (8x8 images, 10 classes).

Plain PyTorch: no torchscalpel import. Runs offline (the data ships with scikit-learn).

    python examples/digits_cnn.py --epochs 3 --batch-size 64 --workers 0 --device cpu
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class DigitsCNN(nn.Module):
    """Two conv blocks and a linear head for 1x8x8 inputs."""

    def __init__(self, width: int = 32, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(2 * width * 16, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def make_model() -> nn.Module:
    """Factory for tools that build the model by name (e.g. scalpel export --model)."""
    return DigitsCNN()


def load_splits(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Digits as float tensors in [0, 1], split 80/20 with a fixed permutation."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(x))
    train, test = perm[:cut], perm[cut:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    """Accuracy on ``loader``."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(dim=1) == y).sum().item()
            total += y.numel()
    model.train()
    return correct / max(total, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", default="", help="write the trained weights (state_dict) here")
    parser.add_argument("--log-every", type=int, default=10, help="print the loss every N steps")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    train_set, test_set = load_splits(args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    test_loader = DataLoader(test_set, batch_size=256, num_workers=args.workers)
    model = DigitsCNN().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    for epoch in range(args.epochs):
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
            if args.steps and step >= args.steps:
                break
        print(f"epoch {epoch} test accuracy {evaluate(model, test_loader, device):.3f}")
        if args.steps and step >= args.steps:
            break
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()

"""Overhead workload: a LightningModule under automatic optimization (closures inside ``step``).

A callback prints one ``loss`` line per training batch so benchmarks/overhead.py can time it.
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
args = parser.parse_args()


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10)
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class PrintLoss(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[override]
        print(f"step {trainer.global_step} loss {outputs['loss'].item():.4f}", flush=True)


torch.manual_seed(0)
data = TensorDataset(torch.randn(128 * 50, 256), torch.randint(0, 10, (128 * 50,)))
trainer = L.Trainer(
    max_steps=args.steps,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[PrintLoss()],
)
trainer.fit(Classifier(), DataLoader(data, batch_size=128, shuffle=True))

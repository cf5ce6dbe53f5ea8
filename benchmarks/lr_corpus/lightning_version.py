"""The same model, data and seed as plain.py, as a LightningModule, for Lightning's Tuner.lr_find.

python lightning_version.py {mlp,cnn,lm} [--min 1e-7] [--max 10] [--steps 100]
prints one JSON line: Lightning's suggestion, and the lrs and smoothed losses it recorded
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import models
import torch


def lightning_find(kind: str, min_lr: float, max_lr: float, steps: int, root: str) -> dict:
    """Tuner.lr_find on the corpus model: its suggestion (None when Lightning makes none), lrs and smoothed losses."""
    import logging

    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = models.build(kind)
            self.lr = 1e-3  # what Tuner.lr_find looks for (it is told not to update it)

        def training_step(self, batch, batch_idx):
            return models.loss_of(kind, self.model, batch)

        def configure_optimizers(self):
            optimizer = models.make_optimizer(kind, self.parameters())
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 50))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    torch.set_num_threads(1)
    module = Module()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    finder = Tuner(trainer).lr_find(
        module,
        train_dataloaders=models.loader(kind, steps),
        min_lr=min_lr,
        max_lr=max_lr,
        num_training=steps,
        early_stop_threshold=4.0,
        update_attr=False,
    )
    if finder is None:
        return {"suggestion": None, "lr": [], "loss": []}
    return {"suggestion": finder.suggestion(), "lr": finder.results["lr"], "loss": finder.results["loss"]}


if __name__ == "__main__":
    import tempfile

    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["mlp", "cnn", "lm"])
    parser.add_argument("--min", type=float, default=1e-7)
    parser.add_argument("--max", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        import json

        print(json.dumps(lightning_find(args.kind, args.min, args.max, args.steps, root)))

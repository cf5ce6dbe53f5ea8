"""``--sanity``: the overfit-one-batch check (rule ``cannot-overfit-batch``).

A second run feeds the first batch of every DataLoader again and again (the loader still ends its
epochs on time, so the script's own loop structure is unchanged). A model, loss and optimizer that
are wired correctly drive the loss on one batch far down within a few dozen steps; if it stays
near its first value, something between data and update is broken (detached loss, zero learning
rate, frozen model, labels that do not match the inputs after a transform, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from statistics import median
from typing import Any

from torch.utils.data import dataloader as dl_module

from torchscalpel.doctor.rules import rt_grads
from torchscalpel.doctor.runtime_rules import RuntimeRule
from torchscalpel.findings import Finding
from torchscalpel.runtime.patching import Undo, wrap_attr

SANITY_STEPS = 60
"""Optimizer steps on the repeated batch."""
MIN_DROP = 0.9
"""The loss on the repeated batch must fall below this fraction of its first value: a wired-up model
moves at least that far within a few dozen steps at any sane learning rate; a broken one stays put."""


class OverfitOneBatch(RuntimeRule):
    """Replays each loader's first batch; reports when the loss on it does not fall."""

    info = rt_grads.CANNOT_OVERFIT_BATCH

    def __init__(self) -> None:
        super().__init__()
        self._first: dict[int, Any] = {}
        self.replayed = 0

    def setup(self) -> Undo:
        rule = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def __next__(it: Any) -> Any:
                batch = original(it)  # still advance, so epochs end when the script expects
                key = id(getattr(it, "_dataset", it))
                if key not in rule._first:
                    rule._first[key] = batch
                    return batch
                rule.replayed += 1
                return rule._first[key]

            return __next__

        return wrap_attr(dl_module._BaseDataLoaderIter, "__next__", make)

    def findings(self, record: Any) -> Iterator[Finding]:
        losses = [
            s.loss
            for s in (record.steps if record is not None else [])
            if s.loss is not None and math.isfinite(s.loss)
        ]
        if len(losses) < 10 or not self.replayed:
            return
        first = median(losses[:2])  # two finite losses: their mean
        best_tail = min(losses[-5:])
        if first <= 1e-6 or best_tail < MIN_DROP * first:
            return
        yield rt_grads.CANNOT_OVERFIT_BATCH.finding(
            f"The model cannot overfit a single batch: after {len(losses)} steps on the same batch the loss is "
            f"{best_tail:.4g}, {best_tail / first:.0%} of its first value {first:.4g}.",
            evidence=[
                "loss on the repeated batch: "
                + ", ".join(f"{x:.3g}" for x in losses[:: max(1, len(losses) // 8)]),
                f"{self.replayed} batches replayed",
            ],
            fix="# check, in order: the loss is computed from model outputs (no .detach()/.item()/argmax),\n"
            "# optimizer.step() runs with lr > 0 over model.parameters(), labels match inputs,\n"
            "# the output layer matches the loss (logits for CrossEntropyLoss, no softmax before it)",
        )

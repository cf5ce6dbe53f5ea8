"""Runtime data rules: an unshuffled training loader, and steps that wait on data."""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc, loader_facts, median
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location, Severity


class TrainLoaders(RuntimeRule):
    """Base: learns which DataLoaders feed training (a backward follows their batch) and keeps their facts."""

    def __init__(self) -> None:
        super().__init__()
        self._last: weakref.ref[Any] | None = None
        self._last_loc: Location | None = None
        self.train: dict[int, dict[str, Any]] = {}
        self.batches: Counter[int] = Counter()

    def on_batch(self, batch: Any, loader: Any) -> None:
        if loader is None:
            return
        self.batches[id(loader)] += 1
        try:
            self._last = weakref.ref(loader)
        except TypeError:
            self._last = None
        if id(loader) not in self.train:
            self._last_loc = user_location()

    def on_backward_pre(self, tensors: Any) -> None:
        loader = self._last() if self._last is not None else None
        if loader is None or id(loader) in self.train:
            return
        facts = loader_facts(loader)
        facts["location"] = self._last_loc
        self.train[id(loader)] = facts
        self.on_train_loader(loader, facts)

    def on_train_loader(self, loader: Any, facts: dict[str, Any]) -> None:
        """A loader was first seen feeding a backward."""


TRAIN_LOADER_NOT_SHUFFLED = RuleInfo(
    slug="train-loader-not-shuffled",
    severity=Severity.WARNING,
    category="loop",
    summary="the training DataLoader reads samples in a fixed order",
    kinds=("runtime",),
)


class TrainLoaderNotShuffled(TrainLoaders):
    """The training loader reads its dataset in the same fixed order every epoch."""

    info = TRAIN_LOADER_NOT_SHUFFLED

    def findings(self, record: Any) -> Iterator[Finding]:
        for facts in self.train.values():
            if facts["iterable"] or facts["custom_batch_sampler"]:
                continue
            fixed = facts["sequential"] or (facts["distributed"] and facts["dist_shuffle"] is False)
            if not fixed or (
                facts["len"] is not None and facts["batch_size"] and facts["len"] <= facts["batch_size"]
            ):
                continue
            dist = facts["distributed"]
            yield TRAIN_LOADER_NOT_SHUFFLED.finding(
                f"The training DataLoader over {facts['dataset']} reads samples in a fixed order ({facts['sampler']}): "
                "batches are correlated (e.g. sorted by class) and every epoch repeats the same sequence.",
                evidence=[
                    f"sampler {facts['sampler']}"
                    + (" with shuffle=False" if dist else "")
                    + f", {facts['len']} samples, batch size {facts['batch_size']}",
                    f"iterated at {fmt_loc(facts['location'])}",
                ],
                fix="DistributedSampler(dataset, shuffle=True)  # and sampler.set_epoch(epoch) each epoch"
                if dist
                else "DataLoader(dataset, batch_size=bs, shuffle=True)",
                location=facts["location"],
            )


DATA_SHARE = 0.30
"""Data wait at or above this share of step time is a finding (the issue's threshold)."""
MIN_DATA_MS = 2.0
"""Below this median wait per step, a high share only means a tiny model; not worth a finding."""


DATALOADER_BOUND = RuleInfo(
    slug="dataloader-bound",
    severity=Severity.WARNING,
    category="performance",
    summary="data wait is at least 30% of step time",
    kinds=("runtime",),
)


class DataloaderBound(TrainLoaders):
    """Steps that spend a large share of their time waiting for the next batch."""

    info = DATALOADER_BOUND

    def findings(self, record: Any) -> Iterator[Finding]:
        steps = [s for s in (record.measured_steps if record is not None else []) if s.total_ms > 0]
        if len(steps) < 3:
            return
        data = sum(s.data_ms for s in steps)
        total = sum(s.total_ms for s in steps)
        # Shares within the same step, never steps per second: a busy machine stretches data and compute
        # alike. The median step's share is robust to the few steps a loaded machine preempts.
        share = max(data / total if total else 0.0, median([s.data_ms / s.total_ms for s in steps]))
        med = median([s.data_ms for s in steps])
        if share < DATA_SHARE or med < MIN_DATA_MS:
            return
        facts = max(self.train.values(), key=lambda f: f.get("num_workers", 0), default=None)
        if self.train:
            busiest = max(self.batches, key=self.batches.__getitem__, default=None)
            facts = self.train.get(busiest, facts) if busiest is not None else facts
        cause, fix = _cause(facts, record)
        yield DATALOADER_BOUND.finding(
            f"Steps wait for data {share:.0%} of the time: the model is starved by the input pipeline ({cause}).",
            evidence=[
                f"median data wait {med:.1f} ms of a median {median([s.total_ms for s in steps]):.1f} ms step "
                f"over {len(steps)} measured steps",
                *(
                    [
                        f"loader: num_workers={facts['num_workers']}, pin_memory={facts['pin_memory']}, "
                        f"batch_size={facts['batch_size']}, dataset {facts['dataset']}"
                    ]
                    if facts
                    else []
                ),
            ],
            fix=fix,
            location=facts.get("location") if facts else None,
        )


def _cause(facts: dict[str, Any] | None, record: Any) -> tuple[str, str]:
    cuda = "cuda" in str((record.config or {}).get("device", "")) if record is not None else False
    if facts is None:
        return "loading in the training loop", "# move per-sample work into a DataLoader with num_workers > 0"
    if not facts["num_workers"]:
        return (
            "num_workers=0: every sample is loaded and transformed in the training process",
            "loader = DataLoader(dataset, batch_size=bs, shuffle=True,\n"
            "                    num_workers=min(8, os.cpu_count()), persistent_workers=True,\n"
            f"                    pin_memory={cuda})",
        )
    if cuda and not facts["pin_memory"]:
        return (
            "pageable host memory: copies to the GPU cannot overlap",
            "DataLoader(..., pin_memory=True)\nx = x.to(device, non_blocking=True)",
        )
    return (
        f"{facts['num_workers']} workers cannot keep up with the per-sample transforms",
        "# more workers, cheaper transforms (precompute, move to GPU, batch them in collate_fn):\n"
        "DataLoader(..., num_workers=2 * old_workers, prefetch_factor=4, persistent_workers=True)",
    )

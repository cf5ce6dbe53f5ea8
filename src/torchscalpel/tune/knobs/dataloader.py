"""Data-loading knob: num_workers, pin_memory, persistent_workers, prefetch_factor.

Applied by wrapping ``DataLoader.__init__`` so every loader the script builds gets the values,
whatever it passed itself. Worker processes load batches while the model computes; with the same
sampler (drawn in the main process) the batches and their order are unchanged, so this is an
exact knob unless the dataset draws random numbers per item.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from torchscalpel.tune.knobs.base import EXACT, ApplyLog, Knob, SetupHook, Undo
from torchscalpel.tune.settings import DataLoaderSpec, TuneSettings

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts


class DataLoaderKnob(Knob):
    """Force DataLoader arguments on every loader the script builds."""

    name = "dataloader"
    numerics = EXACT
    description = "DataLoader num_workers / pin_memory / persistent_workers / prefetch_factor"

    def is_set(self, settings: TuneSettings) -> bool:
        return not settings.dataloader.is_empty()

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        if facts.loaders == 0:
            return [], "the script iterates no torch DataLoader"
        if facts.iterable_dataset:
            return (
                [],
                "the DataLoader wraps an IterableDataset; extra workers would each yield the full stream",
            )
        pin = True if facts.device == "cuda" else None  # page-locked batches copy asynchronously
        if data_bound(facts):
            # The profile says the step waits on data: sweep the worker count (1, 2, 4, ... up to
            # the usable cores), each with persistent workers (no re-fork per epoch) and a deeper
            # prefetch queue, so the fastest count is measured rather than guessed.
            return [
                TuneSettings(
                    dataloader=DataLoaderSpec(
                        num_workers=w,
                        persistent_workers=True,
                        prefetch_factor=4 if w > 0 else None,
                        pin_memory=pin,
                    )
                )
                for w in worker_sweep(facts.cpu_count, facts.loader_workers)
            ], None
        if facts.loader_workers > 0:
            # Workers already on: only the cheap follow-ups are worth a trial.
            spec = DataLoaderSpec(persistent_workers=True, prefetch_factor=4, pin_memory=pin)
            return [TuneSettings(dataloader=spec)], None
        # One worker per spare core (at least 1, at most 4): the main process keeps computing.
        workers = max(1, min(4, facts.cpu_count - 1))
        spec = DataLoaderSpec(num_workers=workers, persistent_workers=True, pin_memory=pin)
        return [TuneSettings(dataloader=spec)], None

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        if not self.is_set(settings):
            return None
        spec = settings.dataloader
        return lambda: patch_dataloader(spec, log)

    def code_lines(self, settings: TuneSettings) -> list[str]:
        if not self.is_set(settings):
            return []
        args = ", ".join(f"{k}={v!r}" for k, v in settings.to_dict()["dataloader"].items())
        return [f"DataLoader(dataset, ..., {args})  # every DataLoader the script builds"]


def patch_dataloader(spec: DataLoaderSpec, log: ApplyLog) -> Undo:
    """Wrap ``DataLoader.__init__`` so it uses ``spec``'s values; returns the undo callable."""
    original = DataLoader.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def patched(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # let the original raise its own error for a bad call
            return original(self, *args, **kwargs)
        values = bound.arguments
        _adjust(values, spec, log)
        return original(*bound.args, **bound.kwargs)

    DataLoader.__init__ = patched  # type: ignore[method-assign]

    def undo() -> None:
        DataLoader.__init__ = original  # type: ignore[method-assign]

    return undo


def _adjust(values: dict[str, Any], spec: DataLoaderSpec, log: ApplyLog) -> None:
    """Change the bound constructor arguments in place, logging each change or why it was not made."""
    dataset = values.get("dataset")
    workers = int(values.get("num_workers", 0) or 0)
    if spec.num_workers is not None and spec.num_workers != workers:
        if isinstance(dataset, IterableDataset) and workers == 0:
            log.skip("dataloader", "num_workers left at 0: the dataset is an IterableDataset")
        else:
            values["num_workers"] = workers = spec.num_workers
            log.did("dataloader", f"DataLoader num_workers={workers}")
    if spec.pin_memory is not None:
        if spec.pin_memory and not torch.cuda.is_available():
            log.skip("dataloader", "pin_memory needs CUDA")
        else:
            values["pin_memory"] = spec.pin_memory
            log.did("dataloader", f"DataLoader pin_memory={spec.pin_memory}")
    # persistent_workers / prefetch_factor are errors with num_workers=0, so only set them with workers.
    for key in ("persistent_workers", "prefetch_factor"):
        value = getattr(spec, key)
        if value is None:
            continue
        if workers == 0:
            log.skip("dataloader", f"{key} needs num_workers > 0")
            continue
        values[key] = value
        log.did("dataloader", f"DataLoader {key}={value}")


MAX_SWEEP_WORKERS = 16
"""The sweep stops here: beyond it workers mostly add memory and start-up time."""


def worker_sweep(cpu_count: int, current: int) -> list[int]:
    """``num_workers`` values to try: 0, 1, 2, 4, ... and the usable core count, without the script's own."""
    usable = max(1, min(cpu_count, MAX_SWEEP_WORKERS))
    values = {0, usable}
    w = 1
    while w < usable:
        values.add(w)
        w *= 2
    return sorted(v for v in values if v != current)


def data_bound(facts: ModelFacts) -> bool:
    """True when the baseline's profile classed the step as data-bound (first or secondary class)."""
    from torchscalpel.tune.bottleneck import Bottleneck

    return "data" in Bottleneck.from_dict(facts.bottleneck).order()

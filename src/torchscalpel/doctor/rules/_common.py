"""Helpers shared by runtime rules: parameter names, class source lines, loader inspection."""

from __future__ import annotations

import inspect
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from torchscalpel.findings import Location, short_path
from torchscalpel.runtime.userframes import Kind, file_kind


def param_names(roots: Iterable[torch.nn.Module]) -> dict[int, str]:
    """id(parameter) -> qualified name, over every root module seen."""
    names: dict[int, str] = {}
    for root in list(roots):
        prefix = type(root).__name__
        for name, p in root.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), f"{prefix}.{name}")
    return names


def optimizer_params(optimizers: Iterable[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """Every parameter held by the optimizers' param groups."""
    out: list[torch.Tensor] = []
    for opt in list(optimizers):
        for group in opt.param_groups:
            out.extend(group["params"])
    return out


def user_class(module: torch.nn.Module) -> bool:
    """True for modules whose class the user wrote: not torch's, and not an installed library's.

    A library's internals are not the user's pitfall: transformers 5 keeps a plain dict of kernel
    modules on its attention classes, which a rule judging "modules in a plain container" would flag for
    every user of that release. The class's file decides (:func:`~torchscalpel.runtime.userframes.file_kind`,
    the rule every ``file:line`` uses); a class with no file (a notebook cell, ``exec``) is the user's.
    """
    cls = type(module)
    name = cls.__module__ or ""
    if name == "torch" or name.startswith("torch."):
        return False
    file = getattr(sys.modules.get(name), "__file__", None)
    if not isinstance(file, str):
        try:
            file = inspect.getsourcefile(cls)
        except (OSError, TypeError):
            file = None
    return file is None or file_kind(file) in (Kind.USER, Kind.GENERATED)


def attribute_location(cls: type, attr: str) -> Location | None:
    """file:line of ``self.attr =`` in ``cls``'s source, when the source is readable."""
    try:
        lines, start = inspect.getsourcelines(cls)
        file = inspect.getsourcefile(cls)
    except (OSError, TypeError):
        return None
    if file is None:
        return None
    pattern = re.compile(rf"self\.{re.escape(attr)}\s*(:[^=]*)?=[^=]")
    for offset, line in enumerate(lines):
        if pattern.search(line):
            return Location(file=file, line=start + offset)
    return Location(file=file, line=start)


def fmt_loc(loc: Location | None) -> str:
    return f"{short_path(loc.file)}:{loc.line}" if loc else "?"


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def loader_facts(loader: Any) -> dict[str, Any]:
    """Plain facts about a DataLoader (kept as data: the loader may be gone when findings are made)."""
    from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler
    from torch.utils.data.distributed import DistributedSampler

    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    # A loader built with batch_sampler=BatchSampler(RandomSampler(...)) (accelerate's prepare(), the HF
    # Trainer) reports a default SequentialSampler as .sampler; the order comes from the batch sampler's.
    inner = getattr(batch_sampler, "sampler", None)
    if isinstance(batch_sampler, BatchSampler) and inner is not None and inner is not sampler:
        sampler = inner
    dataset = getattr(loader, "dataset", None)
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except Exception:
        n = None
    return {
        "sampler": type(sampler).__name__ if sampler is not None else None,
        "sequential": isinstance(sampler, SequentialSampler),
        "random": isinstance(sampler, RandomSampler),
        "distributed": isinstance(sampler, DistributedSampler),
        "dist_shuffle": bool(getattr(sampler, "shuffle", False))
        if isinstance(sampler, DistributedSampler)
        else None,
        "custom_batch_sampler": batch_sampler is not None and type(batch_sampler) is not BatchSampler,
        "iterable": isinstance(dataset, IterableDataset),
        "dataset": type(dataset).__name__,
        "len": n,
        "batch_size": getattr(loader, "batch_size", None),
        "num_workers": getattr(loader, "num_workers", 0),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
    }

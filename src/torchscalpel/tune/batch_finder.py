"""``scalpel batch``: samples/s of an unmodified script at several batch sizes, the best one named,
and the learning-rate scaling rule to keep when the batch changes, stated as advice (never applied).

Each size is one run of the script under the runtime, in this process, with every DataLoader built
with that ``batch_size`` (a loader built with a ``batch_sampler`` or ``batch_size=None`` is left as it
is, and the run says so). Each size ends in one :data:`OUTCOMES`: measured; "does not fit" only when its
run crossed a memory limit (out of memory); "failed" when the script failed otherwise; "not measured"
when the script ended on its own before a measured step, or its data holds fewer samples than the size
(no batch of that size ever existed: see :func:`outcome`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchscalpel.errors import ArgumentError, literal
from torchscalpel.options import STEP_TIMEOUT_S, StageOptions
from torchscalpel.runtime.observer import Observer
from torchscalpel.runtime.patching import Undo, wrap_attr
from torchscalpel.tune.window import BATCH_STEPS, BATCH_WARMUP

if TYPE_CHECKING:
    from torchscalpel.runtime.target import Target

SGD_FAMILY = ("SGD",)
"""Optimizers whose lr scales linearly with the batch (Goyal et al. 2017)."""
ADAPTIVE_FAMILY = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "Adafactor")
"""Optimizers whose lr scales with the square root of the batch (Hoffer et al. 2017; Malladi et al. 2022)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchOptions(StageOptions):
    """The sizes to measure and the steps per size."""

    sizes: tuple[int, ...]
    warmup: int = BATCH_WARMUP
    steps: int = BATCH_STEPS
    step_timeout_s: float | None = STEP_TIMEOUT_S
    target: Target | None = field(default=None, compare=False)
    """The script or module to measure (:func:`torchscalpel.stages.batch.run`)."""
    out_dir: Path | None = None
    """The run folder (default ``scalpel-runs/<time>-batch-<name>/``)."""
    report: bool = True
    """Write report.html beside run.json."""
    out_root: Path | None = field(default=None, compare=False)
    """Where the default run folder goes (the config file's ``out_root``; None: ``scalpel-runs``)."""
    command: tuple[str, ...] = field(default=(), compare=False)
    """The command line the records keep."""

    def __post_init__(self) -> None:
        if not self.sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.sizes):
            raise ArgumentError(
                "{sizes} must be whole numbers of at least 1, got " + literal(list(self.sizes))
            )
        if len(set(self.sizes)) != len(self.sizes):
            raise ArgumentError("{sizes} lists a size twice: " + literal(list(self.sizes)))
        if self.steps < 1 or self.warmup < 0:
            raise ArgumentError("{steps} must be at least 1 and {warmup} at least 0")

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> BatchOptions:
        """The sizes and window ``scalpel batch``'s parsed flags ask for, checked before the script is looked
        for. Without ``--out`` the stage names the run folder."""
        from torchscalpel.runtime.target import target_from_args

        options = cls(
            sizes=tuple(args.sizes),
            steps=args.steps,
            warmup=args.warmup,
            report=not getattr(args, "no_report", False),
            command=("scalpel", *sys.argv[1:]),
            **fields,
        )
        target = target_from_args(args, flags="--sizes " + ",".join(map(str, args.sizes)))
        return options.replace(
            target=target, out_dir=getattr(args, "out", None), out_root=getattr(args, "out_root", None)
        )


def parse_sizes(text: str) -> tuple[int, ...]:
    """``16,32,64`` (``--sizes``): each size a whole number of at least 1 and below 2^63, by the shared number
    rule (a size past 2^63 reached the DataLoader's sampler as the script's own OverflowError traceback)."""
    from torchscalpel.units import parse_int

    parts = [x for x in text.split(",") if x.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"--sizes takes whole numbers separated by commas, got {text!r}")
    return tuple(parse_int(x, flag="--sizes", minimum=1) for x in parts)


OUTCOMES = ("measured", "does not fit", "failed", "not measured")
"""What became of one size (``sections["batch"]["rows"][i]["outcome"]``)."""

_OUT_OF_MEMORY = ("out of memory", "outofmemoryerror", "memoryerror", "memory limit")
"""Phrases of a run's error that mean it crossed a memory limit (CUDA/CPU out of memory, --memory-limit)."""


def outcome(
    *,
    size: int,
    exit_code: int | None,
    error: str | None,
    notes: Sequence[str],
    measured_steps: int,
    steps_seen: int,
    samples: int | None,
    warmup: int,
    steps: int,
) -> tuple[str, str]:
    """``(outcome, why)`` of one size's run: one of :data:`OUTCOMES` and, unless measured, the reason in
    words. ``samples``: the length of the dataset the forced loader reads (None when it has none, e.g. an
    iterable dataset). A size above it is never measured, even when the script stepped: every batch held
    at most ``samples`` rows, so the figure would belong to a smaller batch."""
    if exit_code not in (0, None):
        text = error or "; ".join(notes) or f"exit code {exit_code}"
        if any(phrase in text.lower() for phrase in _OUT_OF_MEMORY):
            return "does not fit", text
        return "failed", text
    if samples is not None and samples < size:
        return "not measured", f"the script's data has {samples} samples, fewer than {size}"
    if measured_steps:
        return "measured", ""
    if steps_seen:
        return "not measured", (
            f"the script ended after {steps_seen} step(s), before {warmup} warm-up and {steps} measured step(s)"
        )
    return "not measured", "; ".join(notes) or "the script ended before its first step"


class ForcedBatch:
    """A setup hook: every ``DataLoader(...)`` built during the run gets ``batch_size=size``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.original: int | None = None
        """The script's own batch size (the first loader's), for the scaling advice."""
        self.untouched = 0
        """Loaders built with a batch_sampler or batch_size=None: left as they were."""
        self.forced = 0
        """Loaders built with ``size``: none means the run measured the script's own batch, not ``size``."""
        self.samples: int | None = None
        """The length of the first forced loader's dataset (None without ``len``): a size above it never ran."""

    def __call__(self) -> Undo:
        from torch.utils.data import DataLoader

        return wrap_attr(DataLoader, "__init__", self._wrap)

    def _wrap(self, original: Any) -> Any:
        forced = self

        def __init__(loader: Any, dataset: Any, *args: Any, **kwargs: Any) -> None:
            if args:  # batch_size is DataLoader's second parameter
                kwargs["batch_size"], args = args[0], args[1:]
            size = kwargs.get("batch_size", 1)
            if kwargs.get("batch_sampler") is not None or size is None:
                forced.untouched += 1
            else:
                if forced.original is None:
                    forced.original = int(size)
                    forced.samples = _length(dataset)
                kwargs["batch_size"] = forced.size
                forced.forced += 1
            original(loader, dataset, *args, **kwargs)

        return __init__


def _length(dataset: Any) -> int | None:
    """``len(dataset)`` for a map-style dataset; None for an iterable one or a ``len`` that fails."""
    try:
        n = len(dataset)
    except Exception:  # an IterableDataset (TypeError) or the script's own __len__ failing: unknown
        return None
    return n if isinstance(n, int) and n >= 0 else None


class OptimizerKind(Observer):
    """The first stepped optimizer's class name (the advice depends on it)."""

    name = "optimizer-kind"

    def __init__(self) -> None:
        self.kind: str | None = None

    def on_optimizer_step_pre(self, optimizer: Any) -> None:
        if self.kind is None:
            self.kind = type(optimizer).__name__


def scaling_advice(optimizer: str | None, base: int | None, best: int | None) -> str:
    """The lr rule to keep when moving from the script's batch ``base`` to ``best`` (advice only)."""
    if best is None:
        return "not measured: no batch size was measured, so there is no size to move to"
    if optimizer is None or base is None:
        return "no advice: the run saw no optimizer step or no DataLoader batch size"
    ratio = best / base
    if optimizer in SGD_FAMILY:
        return (
            f"{optimizer}: scale the lr linearly with the batch: x{ratio:.3g} for {base} -> {best} "
            "(with a warm-up for large factors); not applied"
        )
    if optimizer in ADAPTIVE_FAMILY:
        return (
            f"{optimizer}: scale the lr with the square root of the batch: x{math.sqrt(ratio):.3g} for "
            f"{base} -> {best}; not applied"
        )
    return f"{optimizer}: no standard rule; re-run 'scalpel lr' at batch {best}"


def best_size(rows: Sequence[dict[str, Any]]) -> int | None:
    """The size with the most samples/s among those measured (``fits``: its outcome is "measured")."""
    measured = [r for r in rows if r.get("fits") and r.get("samples_per_s")]
    return max(measured, key=lambda r: r["samples_per_s"])["batch_size"] if measured else None


def not_resized(forced: ForcedBatch) -> str | None:
    """Why a run did not measure ``forced.size`` (no DataLoader took it: the script's own batch ran), else None."""
    if forced.forced:
        return None
    if forced.untouched:
        return (
            f"not measured: the script's {forced.untouched} DataLoader(s) were built with a batch_sampler or "
            f"batch_size=None, so batch {forced.size} was never set; the run measured the script's own batch"
        )
    return (
        f"not measured: the script built no DataLoader, so batch {forced.size} was never set and the run measured "
        "the script's own batch (scalpel batch sets a DataLoader's batch_size)"
    )

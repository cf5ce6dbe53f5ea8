"""The plan: measurements, per-strategy breakdowns, max batch and a recommendation, as one result.

:func:`make_plan` is what the CLI and script mode call; :class:`PlanResult` is what they print and
store in ``record.sections["plan"]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from torchscalpel.plan.devices import Device
from torchscalpel.plan.model_io import LossFn
from torchscalpel.plan.result import PlanResult, Row
from torchscalpel.plan.search import max_batch
from torchscalpel.plan.simulate import Measurement, SimSettings, build_meta_model, simulate
from torchscalpel.plan.spec import BatchSpec
from torchscalpel.plan.strategies import evaluate


@dataclass(kw_only=True, slots=True)
class PlanRequest:
    """Everything a plan depends on."""

    builder: Callable[[], nn.Module]
    batch: BatchSpec
    settings: SimSettings
    loss_fn: LossFn | None = None
    strategies: list[str]
    world_size: int = 1
    nodes: int = 1
    device: Device
    checkpointing: str = "none"
    """``none`` or ``blocks``: the activation checkpointing the rows assume."""
    search_max_batch: bool = True
    model_name: str = "model"
    batch_note: str = ""
    """Which dimension of each batch entry the max-batch search scales, and why (script mode)."""
    cpu_offload: bool = False
    """FSDP rows keep the sharded states in host memory (the script's ``CPUOffload(offload_params=True)`` or
    ``CPUOffloadPolicy()``)."""
    replicated_bytes: int = 0
    """Parameter bytes FSDP leaves unsharded on every rank (the script's ``ignored_modules`` / ``ignored_params``)."""
    fsdp: dict[str, Any] | None = None
    """The script's FSDP wrap as recorded (:class:`torchscalpel.runtime.fsdpwrap.FsdpWrap`: FSDP1 or FSDP2)."""
    progress: Callable[[int, int, str], None] | None = None
    """Called after each strategy's row as ``(rows done, rows planned, what was done)``: the CLI's
    "N of M" with time left (a large model's max-batch search takes minutes per strategy)."""


def make_plan(request: PlanRequest) -> PlanResult:
    """Simulate, evaluate every requested strategy, search max batch, recommend."""
    precision = request.settings.precision

    def meta() -> nn.Module:
        return build_meta_model(request.builder, precision)

    meta()  # factory errors surface here, before any simulation
    ckpt = request.checkpointing == "blocks"
    counter = _Counter(request.progress, len(request.strategies))
    rows, base = _rows(request, meta, ckpt, counter)
    alternatives: list[Row] = []
    other: Measurement | None = None
    if not any(row.breakdown.fits for row in rows) and not ckpt:
        counter.total += len(request.strategies)  # nothing fits: the same rows again with checkpointing
        alternatives, other = _rows(request, meta, True, counter)
    elif request.search_max_batch:  # the full plan: show activations both ways (check_fits skips it)
        other = simulate(meta, request.batch, _settings(request, not ckpt), request.loss_fn)
    result = PlanResult(
        request=request,
        measurement=base,
        rows=rows,
        alternatives=alternatives,
        other_checkpointing_act_peak=other.act_peak_bytes if other is not None else None,
    )
    result.recommended, result.recommendation = recommend(result)
    return result


@dataclass(slots=True)
class _Counter:
    """Rows done of rows planned, reported through :attr:`PlanRequest.progress`."""

    report: Callable[[int, int, str], None] | None
    total: int
    done: int = 0

    def row_done(self, what: str) -> None:
        self.done += 1
        if self.report is not None:
            self.report(self.done, self.total, what)


def _rows(
    request: PlanRequest, meta: Callable[[], nn.Module], ckpt: bool, counter: _Counter
) -> tuple[list[Row], Measurement]:
    settings = _settings(request, ckpt)
    cache: dict[int, Measurement] = {}

    def measure(batch: int) -> Measurement:
        if batch not in cache:
            cache[batch] = simulate(meta, request.batch.with_batch(batch), settings, request.loss_fn)
        return cache[batch]

    base = measure(request.batch.batch_size)
    rows = []
    for strategy in request.strategies:
        bd = evaluate(
            base,
            strategy,
            world_size=request.world_size,
            nodes=request.nodes,
            device=request.device,
            checkpointing=ckpt,
            cpu_offload=request.cpu_offload,
            replicated_bytes=request.replicated_bytes,
        )
        mb = None
        if request.search_max_batch:
            mb = max_batch(
                measure,
                base,
                strategy,
                world_size=request.world_size,
                nodes=request.nodes,
                device=request.device,
                checkpointing=ckpt,
                cpu_offload=request.cpu_offload,
                replicated_bytes=request.replicated_bytes,
            )
        rows.append(Row(breakdown=bd, max_batch=mb))
        counter.row_done(strategy + (" + checkpointing" if ckpt else ""))
    return rows, base


def _settings(request: PlanRequest, ckpt: bool) -> SimSettings:
    s = request.settings
    return SimSettings(
        optimizer=s.optimizer,
        precision=s.precision,
        checkpoint_blocks=ckpt,
        grad_accum=s.grad_accum,
        foreach=s.foreach,
        device=s.device,
    )


_PREFERENCE = ("single", "ddp", "fsdp-grad-op", "fsdp-hybrid", "fsdp-full")
"""Least communication first: a strategy that fits is preferred over one that shards more."""


def recommend(result: PlanResult) -> tuple[str | None, str]:
    """(strategy label, one-sentence reason)."""
    gib = 1024**3
    for rows, note in ((result.rows, ""), (result.alternatives, " with block activation checkpointing")):
        fitting = [r for r in rows if r.breakdown.fits]
        if not fitting:
            continue
        best = min(fitting, key=lambda r: _PREFERENCE.index(r.breakdown.strategy))
        b = best.breakdown
        label = b.strategy + (" + checkpointing" if b.checkpointing else "")
        why = (
            f"{b.strategy}{note} fits with {b.headroom / gib:.2f} GiB headroom per rank "
            f"({b.needed / gib:.2f} of {b.capacity / gib:.2f} GiB) and communicates least among those that fit"
        )
        if best.max_batch:
            why += f"; its largest batch per rank is {best.max_batch}"
        return label, why + "."
    rows = result.all_rows
    if not rows:
        return None, "No strategy was evaluated."
    closest = min(rows, key=lambda r: r.breakdown.needed)
    b = closest.breakdown
    msg = (
        f"Nothing fits: the smallest need is {b.needed / gib:.2f} GiB per rank with {b.strategy}"
        f"{' + checkpointing' if b.checkpointing else ''} against {b.capacity / gib:.2f} GiB"
    )
    fit_batch = [r for r in rows if r.max_batch]
    if fit_batch:
        r = max(fit_batch, key=lambda r: r.max_batch or 0)
        k = -(-result.request.batch.batch_size // int(r.max_batch or 1))
        msg += (
            f"; use batch {r.max_batch} with {r.breakdown.strategy}"
            f"{' + checkpointing' if r.breakdown.checkpointing else ''} and --grad-accum {k}"
        )
    else:
        msg += "; more ranks (sharding), a larger device or a smaller model is needed"
    return None, msg + "."


def check_fits(request: PlanRequest) -> tuple[bool, str]:
    """For ``scalpel launch --plan``: (fits, one sentence). No max-batch search, so it is quick."""
    result = make_plan(dataclasses.replace(request, search_max_batch=False))
    fitting = [r for r in result.all_rows if r.breakdown.fits]
    return bool(fitting), result.recommendation

"""Per-rank memory of each parallel strategy, from one measured single-process timeline.

The simulation gives, after every allocation event, the live bytes of parameters, gradients,
optimizer states, buffers, inputs and activations/temporaries, and the phase (forward, backward,
optimizer). Each strategy re-weights those curves and adds its own buffers; the per-rank peak is the
maximum over events, and the breakdown is read at that event, so the parts add up to the peak.

- ``single``: the curves as measured.
- ``ddp``: plus gradient buckets (one flat copy of all gradients, allocated at construction); on
  gloo (CPU) plus an all-reduce work buffer of the largest bucket (<= 25 MiB) during backward.
- ``fsdp-full`` (FSDP2 ``fully_shard`` per block + root, ``reshard_after_forward=True``): parameters,
  gradients and optimizer states divided by the shard group size, plus what FSDP2 does to each unit,
  replayed on the unit marks of the simulation (:func:`fsdp2_unit_bytes`): a gathered unit holds a
  full unsharded copy of its parameters from its all-gather (its forward; in backward, the
  pre-backward of the unit that ended its forward after it, FSDP2's prefetch) to its reshard (end of its
  forward; end of its backward); the flat output of the last all-gather stays allocated until the
  next all-gather is issued, and the input of the last reduce-scatter until the next one; a unit's
  gradients stay unsharded from their computation to the unit's reduce-scatter, after its last one.
- ``fsdp-grad-op`` (``reshard_after_forward=False``): as full, but units stay gathered from their
  forward to the end of their backward.
- ``fsdp-hybrid`` (HSDP): as full, sharded within a node (world size / nodes ranks) and replicated
  across nodes.
Mixed-precision copies (autocast's cast weights) are part of the measured activations.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchscalpel.plan.devices import Device
from torchscalpel.plan.simulate import Measurement
from torchscalpel.plan.units import ROOT_UNIT

DDP_BUCKET_CAP = 25 * 1024**2


@dataclass(kw_only=True, slots=True)
class Breakdown:
    """One strategy's per-rank memory at its peak event (bytes) and whether it fits."""

    strategy: str
    checkpointing: bool
    params: int
    grads: int
    optim: int
    activations: int
    """Activations, outputs, temporaries, inputs and buffers live at the peak."""
    comm: int
    """DDP buckets, or FSDP's unsharded parameter copies, all-gather / reduce-scatter buffers and the
    unsharded part of not yet reduced gradients, live at the peak."""
    peak: int
    """Allocator peak per rank (what max_memory_allocated / the profiler would show)."""
    margin: int
    """Fragmentation margin and device context added on top (stated, not measured)."""
    needed: int
    capacity: int
    phase: str
    """Phase in which the peak happens."""
    weights_optimizer_rule: int
    """What a weights + gradients + optimizer-state rule (no activations) predicts for this strategy."""
    host: int = 0
    """With CPU offload (FSDP1 ``CPUOffload(offload_params=True)``): the sharded parameters, gradients and
    optimizer state this rank keeps in host memory at the peak, instead of on the device."""

    @property
    def fits(self) -> bool:
        """True when ``needed`` <= ``capacity``."""
        return self.needed <= self.capacity

    @property
    def headroom(self) -> int:
        """Capacity left (negative when it does not fit)."""
        return self.capacity - self.needed

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return {
            "strategy": self.strategy,
            "checkpointing": self.checkpointing,
            "params": self.params,
            "grads": self.grads,
            "optim": self.optim,
            "activations": self.activations,
            "comm": self.comm,
            "peak": self.peak,
            "margin": self.margin,
            "needed": self.needed,
            "capacity": self.capacity,
            "fits": self.fits,
            "headroom": self.headroom,
            "phase": self.phase,
            "weights_optimizer_rule": self.weights_optimizer_rule,
            "host": self.host,
        }


def shard_size(strategy: str, world_size: int, nodes: int) -> int:
    """How many ranks share one copy of the model states."""
    if strategy in ("fsdp-full", "fsdp-grad-op"):
        return world_size
    if strategy == "fsdp-hybrid":
        return max(1, world_size // max(1, nodes))
    return 1


def evaluate(
    m: Measurement,
    strategy: str,
    *,
    world_size: int,
    nodes: int,
    device: Device,
    checkpointing: bool = False,
    cpu_offload: bool = False,
    replicated_bytes: int = 0,
) -> Breakdown:
    """Per-rank peak and breakdown of ``strategy`` from measurement ``m``.

    ``replicated_bytes``: parameter bytes FSDP leaves unsharded (FSDP1's ``ignored_modules``): they, their
    gradients and optimizer state stay whole on every rank (states taken in proportion to the parameters).
    ``cpu_offload`` (FSDP only): the sharded parameters, gradients and optimizer state move to host memory
    (:attr:`Breakdown.host`); the gathered copies and unsharded gradients stay on the device."""
    tl = m.timeline
    b = tl.bytes
    n = shard_size(strategy, world_size, nodes)
    kept = min(1.0, replicated_bytes / m.param_bytes) if m.param_bytes and n > 1 else 0.0

    def per_rank(x: Any) -> Any:
        return x / n if not kept else x * kept + x * (1.0 - kept) / n

    params = per_rank(b["parameters"])
    grads = per_rank(b["gradients"])
    optim = per_rank(b["optimizer_state"])
    host = np.zeros_like(params)
    if cpu_offload and strategy.startswith("fsdp"):
        host = params + grads + optim
        params, grads, optim = np.zeros_like(params), np.zeros_like(params), np.zeros_like(params)
    other = b["activations"] + b["temporaries"] + b["inputs"] + b["buffers"]
    comm = np.zeros_like(params)
    backward = tl.in_phases(("backward",))
    if strategy == "ddp" and world_size > 1:
        comm = comm + m.trainable_bytes
        if device.kind == "cpu":
            comm = comm + backward * min(m.trainable_bytes, DDP_BUCKET_CAP)
    elif strategy.startswith("fsdp") and n > 1:
        comm = comm + fsdp2_unit_bytes(m, n, reshard_after_forward=strategy != "fsdp-grad-op")
    total = params + grads + optim + other + comm
    i = int(np.argmax(total)) if total.size else 0
    peak = int(total[i]) if total.size else 0
    rule = int(
        per_rank(m.trainable_bytes + m.grad_bytes + m.optim_bytes) + (m.param_bytes - m.trainable_bytes)
    )
    return Breakdown(
        strategy=strategy,
        checkpointing=checkpointing,
        params=int(params[i]) if total.size else 0,
        grads=int(grads[i]) if total.size else 0,
        optim=int(optim[i]) if total.size else 0,
        activations=int(other[i]) if total.size else 0,
        comm=int(comm[i]) if total.size else 0,
        peak=peak,
        margin=device.needed(peak) - peak,
        needed=device.needed(peak),
        capacity=device.memory,
        phase=tl.phase_names[int(tl.phase[i])] if total.size else "setup",
        weights_optimizer_rule=rule,
        host=int(host[i]) if total.size else 0,
    )


def fsdp2_unit_bytes(m: Measurement, n: int, *, reshard_after_forward: bool) -> np.ndarray:
    """Bytes FSDP2 holds per rank on top of the sharded states, after every event of ``m``'s timeline.

    Replays the simulation's unit marks (:func:`torchscalpel.plan.units.unit_marks`) through what
    ``fully_shard`` does to each unit (every block, and the root for the parameters outside them) on
    ``n`` ranks: unsharded parameter copies of gathered units, the last all-gather's flat output, the
    last reduce-scatter's input, and the part of not yet reduced gradients that sharding does not
    remove (the timeline counts each gradient once; the strategy divides it by ``n``).
    """
    tl = m.timeline
    size = dict(m.blocks)
    size[ROOT_UNIT] = m.root_param_bytes
    events = tl.phase.size
    delta = np.zeros(events + 1, dtype=np.float64)
    backward_id = tl.phase_names.index("backward") if "backward" in tl.phase_names else -1
    # each backward ends at the first event of another phase after it (or the end of the timeline)
    is_backward = np.r_[tl.phase == backward_id, False]
    backward_ends = [int(j) for j in np.flatnonzero(~is_backward[1:] & is_backward[:-1]) + 1]

    # the last grad mark of each unit in each backward: where its reduce-scatter runs
    last_grad: dict[tuple[int, str], int] = {}
    for k, (i, phase, kind, unit, _) in enumerate(tl.marks):
        if kind == "grad" and phase == backward_id:
            last_grad[(_segment(backward_ends, i), unit)] = k

    gathered: set[str] = set()
    state = {"ag": 0.0, "rs": 0.0}
    pending: dict[str, float] = {}
    post_order: list[str] = []

    def add(i: int, amount: float) -> None:
        delta[min(i, events)] += amount

    def hold(i: int, key: str, amount: float) -> None:
        add(i, amount - state[key])
        state[key] = amount

    def gather(i: int, unit: str) -> None:
        if unit not in gathered:
            gathered.add(unit)
            add(i, size.get(unit, 0))
            hold(i, "ag", size.get(unit, 0))

    def reshard(i: int, unit: str) -> None:
        if unit in gathered:
            gathered.discard(unit)
            add(i, -size.get(unit, 0))

    def end_backward(i: int) -> None:
        # FSDP2's root post-backward callback: every unit resharded, the last buffers released
        for unit in list(gathered):
            reshard(i, unit)
        for b in pending.values():
            add(i, -b)
        pending.clear()
        hold(i, "ag", 0.0)
        hold(i, "rs", 0.0)

    ends = iter(backward_ends)
    next_end = next(ends, None)
    for k, (i, phase, kind, unit, nbytes) in enumerate(tl.marks):
        while next_end is not None and (next_end < i or (next_end == i and phase != backward_id)):
            end_backward(next_end)
            next_end = next(ends, None)
        if phase == backward_id:
            if kind == "pre_backward":
                gather(i, unit)
                # FSDP2's backward prefetch: the next unit in reverse post-forward order
                if unit in post_order and post_order.index(unit) > 0:
                    gather(i, post_order[post_order.index(unit) - 1])
            elif kind == "grad":
                extra = nbytes * (1 - 1 / n)
                pending[unit] = pending.get(unit, 0.0) + extra
                add(i, extra)
                if last_grad.get((_segment(backward_ends, i), unit)) == k:  # post-backward
                    add(i, -pending.pop(unit))
                    hold(i, "rs", size.get(unit, 0))
                    reshard(i, unit)
        elif kind == "pre_forward":
            if unit == ROOT_UNIT:
                post_order = []
            gather(i, unit)
        elif kind == "post_forward":
            if unit not in post_order:
                post_order.append(unit)
            if reshard_after_forward:
                reshard(i, unit)
    while next_end is not None:
        end_backward(next_end)
        next_end = next(ends, None)
    return np.cumsum(delta)[: tl.phase.size]


def _segment(backward_ends: list[int], i: int) -> int:
    """Which backward (0, 1, ...) a mark at event ``i`` belongs to."""
    return bisect.bisect_left(backward_ends, i)


def strategies_for(requested: str, world_size: int, nodes: int) -> list[str]:
    """The strategies ``--strategy`` names (``all``: those that make sense for this world size)."""
    if requested != "all":
        return [requested]
    if world_size <= 1:
        return ["single"]
    out = ["ddp", "fsdp-grad-op", "fsdp-full"]
    if nodes > 1 and world_size // nodes > 1:
        out.append("fsdp-hybrid")
    return out

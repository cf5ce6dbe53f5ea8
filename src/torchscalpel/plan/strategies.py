"""Per-rank memory of each parallel strategy, from one measured single-process timeline.

The simulation gives, after every allocation event, the live bytes of parameters, gradients,
optimizer states, buffers, inputs and activations/temporaries, and the phase (forward, backward,
optimizer). Each strategy re-weights those curves and adds its own buffers; the per-rank peak is the
maximum over events, and the breakdown is read at that event, so the parts add up to the peak.

- ``single``: the curves as measured.
- ``ddp``: plus gradient buckets (one flat copy of all gradients, allocated at construction); on
  gloo (CPU) plus an all-reduce work buffer of the largest bucket (<= 25 MiB) during backward.
- ``fsdp-full`` (FSDP2 ``fully_shard`` per block + root, ``reshard_after_forward=True``): parameters,
  gradients and optimizer states divided by the shard group size; during forward/backward the root
  unit stays gathered, and in flight there are the current and the prefetched block
  (all-gather output and copy-out: 3 x largest block); during backward the unsharded gradients of a
  block and the reduce-scatter input (2 x largest block).
- ``fsdp-grad-op`` (``reshard_after_forward=False``): as full, but every block stays gathered from its
  forward to its backward.
- ``fsdp-hybrid`` (HSDP): as full, sharded within a node (world size / nodes ranks) and replicated
  across nodes.
Mixed-precision copies (autocast's cast weights) are part of the measured activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torchscalpel.plan.devices import Device
from torchscalpel.plan.simulate import Measurement

STRATEGIES = ("single", "ddp", "fsdp-full", "fsdp-grad-op", "fsdp-hybrid")
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
    """DDP buckets / FSDP all-gather and reduce-scatter buffers live at the peak."""
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
            "strategy": self.strategy, "checkpointing": self.checkpointing, "params": self.params,
            "grads": self.grads, "optim": self.optim, "activations": self.activations, "comm": self.comm,
            "peak": self.peak, "margin": self.margin, "needed": self.needed, "capacity": self.capacity,
            "fits": self.fits, "headroom": self.headroom, "phase": self.phase,
            "weights_optimizer_rule": self.weights_optimizer_rule,
        }


def shard_size(strategy: str, world_size: int, nodes: int) -> int:
    """How many ranks share one copy of the model states."""
    if strategy in ("fsdp-full", "fsdp-grad-op"):
        return world_size
    if strategy == "fsdp-hybrid":
        return max(1, world_size // max(1, nodes))
    return 1


def evaluate(m: Measurement, strategy: str, *, world_size: int, nodes: int, device: Device,
             checkpointing: bool = False) -> Breakdown:
    """Per-rank peak and breakdown of ``strategy`` from measurement ``m``."""
    tl = m.timeline
    b = tl.bytes
    n = shard_size(strategy, world_size, nodes)
    params = b["param"] / n
    grads = b["grad"] / n
    optim = b["optim"] / n
    other = b["act"] + b["input"] + b["buffer"]
    comm = np.zeros_like(params)
    train = tl.in_phases(("forward", "backward"))
    backward = tl.in_phases(("backward",))
    forward = tl.in_phases(("forward",))
    if strategy == "ddp" and world_size > 1:
        comm = comm + m.trainable_bytes
        if device.kind == "cpu":
            comm = comm + backward * min(m.trainable_bytes, DDP_BUCKET_CAP)
    elif strategy.startswith("fsdp") and n > 1:
        unit = max((size for _, size in m.blocks), default=0)
        root = m.root_param_bytes * (1 - 1 / n)
        comm = comm + train * (root + 3 * unit) + backward * (2 * unit)
        if strategy == "fsdp-grad-op":
            blocks_total = sum(size for _, size in m.blocks) * (1 - 1 / n)
            # Blocks gather one by one in forward and stay gathered until their backward: ramp up in
            # forward, all of them at the start of backward (the peak), released as backward proceeds.
            comm = comm + (forward * _ramp(forward) + backward * (1 - _ramp(backward))) * blocks_total
    total = params + grads + optim + other + comm
    i = int(np.argmax(total)) if total.size else 0
    peak = int(total[i]) if total.size else 0
    rule = int((m.trainable_bytes + m.grad_bytes + m.optim_bytes) / n + (m.param_bytes - m.trainable_bytes))
    return Breakdown(
        strategy=strategy, checkpointing=checkpointing,
        params=int(params[i]) if total.size else 0, grads=int(grads[i]) if total.size else 0,
        optim=int(optim[i]) if total.size else 0, activations=int(other[i]) if total.size else 0,
        comm=int(comm[i]) if total.size else 0, peak=peak, margin=device.needed(peak) - peak,
        needed=device.needed(peak), capacity=device.memory,
        phase=tl.phase_names[int(tl.phase[i])] if total.size else "setup",
        weights_optimizer_rule=rule,
    )


def _ramp(mask: np.ndarray) -> np.ndarray:
    """0 -> 1 across each contiguous run of True in ``mask`` (0 elsewhere)."""
    out = np.zeros(mask.shape, dtype=np.float64)
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return out
    breaks = np.flatnonzero(np.diff(idx) > 1)
    starts = np.r_[0, breaks + 1]
    ends = np.r_[breaks, idx.size - 1]
    for s, e in zip(starts, ends, strict=True):
        seg = idx[s : e + 1]
        out[seg] = np.linspace(0.0, 1.0, seg.size) if seg.size > 1 else 1.0
    return out


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

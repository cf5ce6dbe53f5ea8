"""Measured peaks of real training steps on CPU, for checking plans (benchmark, tests, calibration).

The peak is allocator-level: torch.profiler's ``[memory]`` events carry the CPU allocator's running
``Total Allocated`` (counted from the moment profiling starts), so the model, optimizer and batch are
built inside the profiling window and the peak is everything the step needs. TORCH-FACTS: this,
saved-tensor hooks and MemTracker agree on CPU; process RSS does not.

With gloo collectives the counter drifts upwards: the CPU allocator reports a free to the profiler
only on a thread where profiling is enabled, and a gloo worker thread is profiled only while it runs
a collective. A block whose last reference the worker drops after that (gloo's reduce-scatter clones
its input and the worker releases the clone when the work object dies; a tensor handed to a
collective that the caller already dropped) is freed for real but never subtracted, so every later
reading is too high by its size. Which thread drops last is a race, so the error changes from run to
run and rank to rank. :func:`allocator_peak` finds those blocks (their address is allocated again
while still live, or they outlive the window, which ends after a garbage collection) and frees them
when the collective that released them completes.
"""

from __future__ import annotations

import bisect
import gc
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from torchscalpel.plan.model_io import LossFn, default_loss, unique_params
from torchscalpel.plan.simulate import SimSettings
from torchscalpel.plan.spec import BatchSpec


@dataclass(frozen=True, slots=True)
class MemoryEvent:
    """One profiler ``[memory]`` event: ``nbytes`` > 0 allocates, < 0 frees the block at ``addr``."""

    ts: float
    tid: str
    addr: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Span:
    """One profiled op or annotation (a chrome-trace ``X`` event) on thread ``tid``."""

    name: str
    tid: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """A profiled window's allocator peak, and how much of the raw counter was repaired."""

    peak: int
    """Peak live bytes with the frees the profiler missed restored (what :func:`profiled_peak` returns)."""
    counter_peak: int
    """Peak of the profiler's own running ``Total Allocated`` (from the window's start)."""
    repaired_bytes: int
    """Bytes of blocks whose free the profiler missed and that were freed at their collective's end."""
    unresolved_bytes: int
    """Bytes still live at the end of the window, not tied to a collective (left as they are)."""
    peak_ts: float = 0.0
    """Profiler timestamp (us) of the event at which the repaired peak is reached."""


COLLECTIVE_OP_PREFIX = "c10d::"
"""Dispatcher ops that issue a collective on the calling thread."""
WORKER_SPAN_PREFIXES = ("gloo:",)
"""Names of the spans a process group's worker thread records while it runs a collective."""


def allocator_peak(
    events: Iterable[MemoryEvent], spans: Iterable[Span], *, window_end_is_clean: bool = True
) -> MemoryReading:
    """Peak live bytes of a window's allocation events, restoring the frees the profiler missed.

    A missed free shows as a block whose address is allocated again while the block is still live, or
    (when ``window_end_is_clean``: everything the window allocated was released before it ended) as a
    block still live at the end. Such a block was released by a collective's worker thread, so it is
    freed at the completion of the first collective issued at or after its allocation: the end of the
    worker span that ran it (collectives and worker spans pair in issue order; gloo's queue is FIFO),
    else the end of the issuing op, and never later than its address's reuse. Blocks with no
    collective after them stay live (a single-process window is read exactly as the counter reads it).
    """
    evs = sorted(events, key=lambda e: e.ts)
    all_spans = list(spans)
    issued = _outermost(
        sorted((s for s in all_spans if s.name.startswith(COLLECTIVE_OP_PREFIX)), key=lambda s: s.start)
    )
    workers = sorted((s for s in all_spans if s.name.startswith(WORKER_SPAN_PREFIXES)), key=lambda s: s.start)
    done = [w.end for w in workers] if len(workers) == len(issued) else [c.end for c in issued]
    starts = [c.start for c in issued]

    live: dict[int, int] = {}
    missed: list[tuple[int, float | None]] = []  # (index of the allocation event, latest possible free)
    for i, e in enumerate(evs):
        if e.nbytes > 0:
            if e.addr in live:
                missed.append((live[e.addr], e.ts))
            live[e.addr] = i
        else:
            live.pop(e.addr, None)
    unresolved = 0
    if window_end_is_clean:
        missed.extend((i, None) for i in live.values())
    else:
        unresolved = sum(evs[i].nbytes for i in live.values())

    frees: list[tuple[float, int]] = []
    for i, latest in missed:
        k = bisect.bisect_left(starts, evs[i].ts)
        # an allocation inside the issuing op belongs to that collective
        if (
            k > 0
            and issued[k - 1].tid == evs[i].tid
            and issued[k - 1].start <= evs[i].ts <= issued[k - 1].end
        ):
            k -= 1
        # freed at the collective's end or at the reuse of its address, whichever came first
        known = [t for t in (done[k] if k < len(done) else None, latest) if t is not None]
        if not known:
            unresolved += evs[i].nbytes
            continue
        frees.append((max(min(known), evs[i].ts), evs[i].nbytes))
    frees.sort()

    total = counter = peak = counter_peak = 0
    peak_ts = evs[0].ts if evs else 0.0
    j = 0
    for e in evs:
        while j < len(frees) and frees[j][0] <= e.ts:  # a free at the reuse of its address comes first
            total -= frees[j][1]
            j += 1
        total += e.nbytes
        counter += e.nbytes
        if total > peak:
            peak, peak_ts = total, e.ts
        counter_peak = max(counter_peak, counter)
    return MemoryReading(
        peak=peak,
        counter_peak=counter_peak,
        repaired_bytes=sum(n for _, n in frees),
        unresolved_bytes=unresolved,
        peak_ts=peak_ts,
    )


def _outermost(spans: list[Span]) -> list[Span]:
    """Spans (sorted by start) not nested inside an earlier span of the same thread."""
    out: list[Span] = []
    last_end: dict[str, float] = {}
    for s in spans:
        if s.start <= last_end.get(s.tid, float("-inf")):
            continue
        out.append(s)
        last_end[s.tid] = s.end
    return out


def profiled_memory(fn: Callable[[], None]) -> MemoryReading:
    """The CPU allocator's peak while ``fn`` runs (bytes), from torch.profiler's memory events."""
    # Leftovers of an earlier run (FSDP modules hold reference cycles) must not be freed inside
    # this window: their frees would lower the counter below what this run allocated.
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
        # ... and this run's own cycles are freed inside it, so that what outlives the window is
        # a free the profiler missed (see allocator_peak).
        gc.collect()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            trace = json.load(fh).get("traceEvents", [])
    finally:
        os.unlink(path)
    events, spans = [], []
    for e in trace:
        args = e.get("args", {})
        if e.get("name") == "[memory]":
            # frees of blocks allocated before the window count too (as the counter does): the
            # garbage collection above keeps them out, and a run's peak is what it adds on top.
            if str(args.get("Device Type", 0)) in ("0", "cpu"):
                events.append(
                    MemoryEvent(
                        ts=float(e.get("ts", 0)),
                        tid=str(e.get("tid")),
                        addr=int(args.get("Addr", 0)),
                        nbytes=int(args.get("Bytes", 0)),
                    )
                )
        elif e.get("ph") == "X":
            start = float(e.get("ts", 0))
            spans.append(
                Span(
                    name=str(e.get("name", "")),
                    tid=str(e.get("tid")),
                    start=start,
                    end=start + float(e.get("dur", 0)),
                )
            )
    return allocator_peak(events, spans)


def profiled_peak(fn: Callable[[], None]) -> int:
    """Peak of the CPU allocator's live bytes while ``fn`` runs (bytes); see :func:`profiled_memory`."""
    return profiled_memory(fn).peak


def train_steps(
    model: nn.Module,
    batch: BatchSpec,
    settings: SimSettings,
    loss_fn: LossFn | None = None,
    *,
    steps: int = 3,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    device: str = "cpu",
) -> None:
    """A plain training loop: zero_grad(set_to_none), forward, loss, backward, step; ``steps`` times."""
    whole = {"bf16": torch.bfloat16, "fp64": torch.float64}.get(
        settings.precision
    )  # the whole model in one dtype
    if whole is not None:
        model = model.to(whole)
    if wrap is not None:
        model = wrap(model)
    params = [p for p in unique_params(model) if p.requires_grad]
    optimizer = settings.optimizer.build(params, foreach=settings.foreach)
    for _ in range(steps):
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        for _ in range(settings.grad_accum):
            tensors = batch.make(device)
            if whole is not None:
                tensors = {k: v.to(whole) if v.is_floating_point() else v for k, v in tensors.items()}
            dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(settings.precision)
            with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                if loss_fn is not None:
                    out, loss = None, loss_fn(model, tensors)
                else:
                    out, loss = default_loss(model, tensors)
            loss.float().backward()
            del tensors
        if optimizer is not None:
            optimizer.step()
        del out, loss


def wrap_for(
    strategy: str, blocks_of: Callable[[nn.Module], list[tuple[str, nn.Module]]]
) -> Callable[[nn.Module], nn.Module]:
    """The wrapping a plan assumes for ``strategy`` (needs an initialised process group).

    ``ddp``: DistributedDataParallel with default buckets. ``fsdp-full`` / ``fsdp-grad-op``: FSDP2
    ``fully_shard`` on every block, then on the root, with ``reshard_after_forward`` True / False.
    """

    def wrap(model: nn.Module) -> nn.Module:
        if strategy == "single":
            return model
        if strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model)
        if strategy in ("fsdp-full", "fsdp-grad-op"):
            import torch.distributed as dist
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            reshard = strategy == "fsdp-full"
            for _, block in blocks_of(model):
                fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
            return model
        raise ValueError(f"no measured wrapping for strategy {strategy!r}")

    return wrap


def cuda_peak(fn: Callable[[], None]) -> int:
    """``torch.cuda.max_memory_allocated`` while ``fn`` runs, above what was allocated before it."""
    # As in profiled_peak: garbage of an earlier run (model reference cycles) collected inside this
    # window would lower the counter by its size. On an H200 a Llama row read 3588 MiB after three
    # other models and 3985 MiB when run first; the plan said 3948.
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base

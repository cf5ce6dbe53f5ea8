"""Measured peaks of real training steps on CPU, for checking plans (benchmark, tests, calibration).

The peak is allocator-level: torch.profiler's ``[memory]`` events carry the CPU allocator's running
``Total Allocated`` (counted from the moment profiling starts), so the model, optimizer and batch are
built inside the profiling window and the peak is everything the step needs. TORCH-FACTS: this,
saved-tensor hooks and MemTracker agree on CPU; process RSS does not.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
from collections.abc import Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from torchscalpel.plan.model_io import LossFn, default_loss, unique_params
from torchscalpel.plan.simulate import SimSettings
from torchscalpel.plan.spec import BatchSpec


def profiled_peak(fn: Callable[[], None]) -> int:
    """Peak of the CPU allocator's ``Total Allocated`` while ``fn`` runs (bytes)."""
    # Leftovers of an earlier run (FSDP modules hold reference cycles) must not be freed inside
    # this window: their frees would lower the counter below what this run allocated.
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh).get("traceEvents", [])
    finally:
        os.unlink(path)
    # The counter is not reset between profiling sessions in one process: measure from the level
    # before the first allocation of this window.
    base: int | None = None
    peak = 0
    for event in sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e.get("ts", 0)):
        args = event.get("args", {})
        if str(args.get("Device Type", 0)) not in ("0", "cpu"):
            continue
        total = int(args.get("Total Allocated", 0))
        if base is None:
            base = total - int(args.get("Bytes", 0))
        peak = max(peak, total - base)
    return peak


def train_steps(
    model: nn.Module, batch: BatchSpec, settings: SimSettings, loss_fn: LossFn | None = None, *, steps: int = 3,
    wrap: Callable[[nn.Module], nn.Module] | None = None, device: str = "cpu",
) -> None:
    """A plain training loop: zero_grad(set_to_none), forward, loss, backward, step; ``steps`` times."""
    if settings.precision == "bf16":
        model = model.to(torch.bfloat16)
    if wrap is not None:
        model = wrap(model)
    params = [p for p in unique_params(model) if p.requires_grad]
    optimizer = settings.optimizer.build(params, foreach=settings.foreach)
    for _ in range(steps):
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        for _ in range(settings.grad_accum):
            tensors = batch.make(device)
            if settings.precision == "bf16":
                tensors = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}
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


def wrap_for(strategy: str, blocks_of: Callable[[nn.Module], list[tuple[str, nn.Module]]]) -> Callable[[nn.Module], nn.Module]:
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

"""Runtime halves of two scaling rules: DDP accumulating without ``no_sync()``, and a DistributedSampler
whose ``num_replicas`` / ``rank`` disagree with the process group.

- ``ddp-accumulation-without-no-sync``: DDP reads ``require_backward_grad_sync`` at each backward (``no_sync()``
  sets it to False for its block, nanoGPT sets it by hand); when every backward between two optimizer steps
  ran with it on, and there were 2+ of them, each micro-batch paid a full all-reduce of the gradients.
- ``distributed-sampler-wrong-world``: the sampler of every DataLoader a batch came from, compared with
  ``dist.get_world_size()`` / ``get_rank()`` once the process group exists; ``DistributedSampler.__init__``
  is wrapped for the run to remember the user's line that built each sampler.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchscalpel.doctor.rules import accum_static, dist_static
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location
from torchscalpel.runtime.patching import Undo, wrap_attr
from torchscalpel.units import fmt_bytes


class DdpAccumWithoutNoSync(RuntimeRule):
    """Optimizer steps over 2+ backward calls of a DDP model, every one of them all-reducing."""

    info = accum_static.DDP_ACCUMULATION_WITHOUT_NO_SYNC
    MIN_STEPS = 2

    def __init__(self) -> None:
        super().__init__()
        self.ddps: list[Any] = []
        self._seen: set[int] = set()
        self.backwards = 0
        self.synced = 0
        self.bad_steps = 0
        self.good_steps = 0
        self.micro: list[int] = []
        self.grad_bytes = 0
        self.location: Location | None = None

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if not root or id(module) in self._seen:
            return
        self._seen.add(id(module))
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(module, DistributedDataParallel):
            self.ddps.append(module)
            self.grad_bytes += sum(
                p.numel() * p.element_size() for p in module.parameters() if p.requires_grad
            )

    def on_backward_pre(self, tensors: Any) -> None:
        if not self.ddps:
            return
        self.backwards += 1
        if all(getattr(m, "require_backward_grad_sync", True) for m in self.ddps):
            self.synced += 1
            if self.location is None and self.backwards >= 2:
                self.location = user_location()

    def on_optimizer_step_pre(self, optimizer: Any) -> None:
        if self.backwards >= 2:
            if self.synced == self.backwards:
                self.bad_steps += 1
                self.micro.append(self.backwards)
            else:
                self.good_steps += 1
        if self.backwards:
            self.backwards = self.synced = 0

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.bad_steps < self.MIN_STEPS or self.good_steps:
            return
        k = max(set(self.micro), key=self.micro.count)
        wasted = (k - 1) * self.grad_bytes
        yield accum_static.DDP_ACCUMULATION_WITHOUT_NO_SYNC.finding(
            f"{self.bad_steps} optimizer steps each accumulated {k} backward calls of a DDP model with gradient "
            f"sync on in every one: {k} all-reduces per step where the last one is enough.",
            evidence=[
                f"DDP's require_backward_grad_sync was True in all {k} backward calls of {self.bad_steps} steps",
                f"gradients all-reduced per micro-batch: {fmt_bytes(self.grad_bytes)}; "
                f"{fmt_bytes(wasted)} per optimizer step are all-reduced for nothing",
                *([f"backward at {fmt_loc(self.location)}"] if self.location else []),
            ],
            fix=(
                "import contextlib\n"
                f"sync = (i + 1) % {k} == 0\n"
                "with contextlib.nullcontext() if sync else model.no_sync():  # all-reduce on the last micro-batch only\n"
                f"    (criterion(model(x), y) / {k}).backward()"
            ),
            location=self.location,
        )


class SamplerNumReplicas(RuntimeRule):
    """A DistributedSampler whose num_replicas or rank is not the process group's."""

    info = dist_static.DISTRIBUTED_SAMPLER_WRONG_WORLD

    def __init__(self) -> None:
        super().__init__()
        self._checked: set[int] = set()
        self.found: list[str] = []
        self.location: Location | None = None
        self._sites: weakref.WeakKeyDictionary[Any, Location | None] = weakref.WeakKeyDictionary()

    def setup(self) -> Undo:
        """Remember the user's line that built each DistributedSampler (the line the fix edits)."""
        from torch.utils.data.distributed import DistributedSampler

        note = self.safe(lambda sampler: self._sites.setdefault(sampler, user_location()))

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def init(sampler: Any, *args: Any, **kwargs: Any) -> None:
                original(sampler, *args, **kwargs)
                note(sampler)

            return init

        return wrap_attr(DistributedSampler, "__init__", make)

    def on_batch(self, batch: Any, loader: Any) -> None:
        if loader is None or id(loader) in self._checked:
            return
        self._checked.add(id(loader))
        import torch.distributed as dist
        from torch.utils.data.distributed import DistributedSampler

        sampler = getattr(loader, "sampler", None)
        inner = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
        if not isinstance(sampler, DistributedSampler) and isinstance(inner, DistributedSampler):
            sampler = inner
        if not isinstance(sampler, DistributedSampler) or not (dist.is_available() and dist.is_initialized()):
            return
        world, rank = dist.get_world_size(), dist.get_rank()
        if sampler.num_replicas != world or sampler.rank != rank:
            self.location = self.location or self._sites.get(sampler)
            self.found.append(
                f"DistributedSampler(num_replicas={sampler.num_replicas}, rank={sampler.rank}) in a process group "
                f"of world size {world}, this process rank {rank}: each rank reads {sampler.num_samples} of "
                f"{len(sampler.dataset)} samples ({sampler.num_samples * world} read in all)"  # type: ignore[arg-type]
            )

    def findings(self, record: Any) -> Iterator[Finding]:
        if not self.found:
            return
        yield dist_static.DISTRIBUTED_SAMPLER_WRONG_WORLD.finding(
            "The DistributedSampler does not split the data over the processes that run: its num_replicas/rank "
            "are not the process group's, so ranks read the same samples twice or some never.",
            evidence=self.found,
            fix="sampler = DistributedSampler(dataset)  # num_replicas and rank default to the process group's",
            location=self.location,
        )

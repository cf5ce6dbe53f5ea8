"""Runtime distributed rules: DDP with plain BatchNorm, no DistributedSampler, set_epoch never called,
find_unused_parameters, DataParallel, optimizer built before FSDP (fully_shard or FullyShardedDataParallel)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules import dist_static, fsdp_static
from torchscalpel.doctor.rules._common import fmt_loc, optimizer_params
from torchscalpel.doctor.rules.rt_data import TrainLoaders
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.patching import Undo, wrap_attr


def _is_ddp(m: torch.nn.Module) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(m, DistributedDataParallel)


def _is_fsdp(m: torch.nn.Module) -> bool:
    """Sharded by FSDP2 (``fully_shard``: an ``FSDPModule`` inside) or FSDP1 (a ``FullyShardedDataParallel``)."""
    kinds: list[type] = []
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        kinds.append(FullyShardedDataParallel)
        from torch.distributed.fsdp import FSDPModule

        kinds.append(FSDPModule)
    except ImportError:  # a torch built without distributed, or before FSDP2
        pass
    return bool(kinds) and any(isinstance(x, tuple(kinds)) for x in m.modules())


class _RootScan(RuntimeRule):
    def __init__(self) -> None:
        super().__init__()
        self._seen: set[int] = set()

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if root and id(module) not in self._seen:
            self._seen.add(id(module))
            self.scan(module)

    def scan(self, root: torch.nn.Module) -> None:
        raise NotImplementedError


DDP_BATCHNORM_NOT_SYNCED = RuleInfo(
    slug="ddp-batchnorm-not-synced",
    severity=Severity.WARNING,
    category="distributed",
    summary="BatchNorm under DDP without SyncBatchNorm",
    kinds=("runtime",),
)


class DdpBatchnormNotSynced(_RootScan):
    """A DDP-wrapped model with BatchNorm layers that are not SyncBatchNorm."""

    info = DDP_BATCHNORM_NOT_SYNCED

    def __init__(self) -> None:
        super().__init__()
        self.bns: list[str] = []
        self.on_gpu = False
        self.location: Location | None = None

    def scan(self, root: torch.nn.Module) -> None:
        from torch.nn.modules.batchnorm import _BatchNorm

        if not _is_ddp(root):
            return
        for name, m in root.named_modules():
            if isinstance(m, _BatchNorm) and not isinstance(m, torch.nn.SyncBatchNorm):
                self.bns.append(f"{name} ({type(m).__name__})")
                tensor = next(iter([*m.parameters(), *m.buffers()]), None)
                self.on_gpu = self.on_gpu or (tensor is not None and tensor.device.type != "cpu")
        if self.bns:
            self.location = user_location()

    def findings(self, record: Any) -> Iterator[Finding]:
        if not self.bns:
            return
        evidence = [
            ", ".join(self.bns[:6]) + (" ..." if len(self.bns) > 6 else ""),
            f"model called at {fmt_loc(self.location)}",
        ]
        message = (
            f"The DDP model has {len(self.bns)} BatchNorm layer(s) that normalise with each rank's local batch "
            "only: statistics differ across ranks and from single-device training with the same global batch."
        )
        if self.on_gpu:
            yield DDP_BATCHNORM_NOT_SYNCED.finding(
                message,
                evidence=evidence,
                location=self.location,
                fix="model = nn.SyncBatchNorm.convert_sync_batchnorm(model)   # before DDP(...)\n"
                "model = DDP(model.to(local_rank), device_ids=[local_rank])",
            )
            return
        # SyncBatchNorm has no CPU kernel: on CPU there is nothing to convert to, so this is a fact
        # about the run, not a mistake.
        yield DDP_BATCHNORM_NOT_SYNCED.finding(
            message + " On CPU, SyncBatchNorm cannot run, so this is expected.",
            evidence=evidence,
            location=self.location,
            severity=Severity.INFO,
            fix="# CPU: keep each rank's batch large enough for stable statistics, or use GroupNorm/LayerNorm;\n"
            "# on GPUs: model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP(...)",
        )


DDP_NO_DISTRIBUTED_SAMPLER = RuleInfo(
    slug="ddp-no-distributed-sampler",
    severity=Severity.ERROR,
    category="distributed",
    summary="ranks read the same samples (no DistributedSampler)",
    kinds=("runtime",),
)


class DdpDataRules(TrainLoaders):
    """Under DDP/FSDP: a training loader without DistributedSampler; a DistributedSampler never given set_epoch."""

    infos = (DDP_NO_DISTRIBUTED_SAMPLER, dist_static.SAMPLER_SET_EPOCH_MISSING)

    def __init__(self) -> None:
        super().__init__()
        self.wrapped = False
        self._iters: dict[int, list[int]] = defaultdict(list)
        # samplers whose set_epoch() ran: a loader read twice per epoch (a peek for the batch size, then
        # the loop) repeats an epoch, but the order still changes between epochs
        self._epoch_set: set[int] = set()
        self._sampler_loc: Location | None = None

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if root and not self.wrapped and (_is_ddp(module) or _is_fsdp(module)):
            self.wrapped = True

    def setup(self) -> Undo:
        from torch.utils.data.distributed import DistributedSampler

        rule = self

        def seen(sampler: Any) -> None:
            if sampler.shuffle:
                rule._iters[id(sampler)].append(int(sampler.epoch))
                rule._sampler_loc = rule._sampler_loc or user_location()

        safe_seen = self.safe(seen)

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def __iter__(sampler: Any) -> Any:
                safe_seen(sampler)
                return original(sampler)

            return __iter__

        def make_set_epoch(original: Callable[..., Any]) -> Callable[..., Any]:
            def set_epoch(sampler: Any, epoch: int) -> Any:
                rule._epoch_set.add(id(sampler))
                return original(sampler, epoch)

            return set_epoch

        undo_iter = wrap_attr(DistributedSampler, "__iter__", make)
        undo_set_epoch = wrap_attr(DistributedSampler, "set_epoch", make_set_epoch)

        def undo() -> None:
            undo_set_epoch()
            undo_iter()

        return undo

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.wrapped:
            for facts in self.train.values():
                if facts["distributed"] or facts["iterable"] or facts["custom_batch_sampler"]:
                    continue
                world = (
                    torch.distributed.get_world_size()
                    if torch.distributed.is_available() and torch.distributed.is_initialized()
                    else None
                )
                yield DDP_NO_DISTRIBUTED_SAMPLER.finding(
                    f"The model is wrapped for data parallelism but the training DataLoader uses {facts['sampler']}: "
                    "every rank reads the same samples, so N ranks do the work of one.",
                    evidence=[
                        f"loader over {facts['dataset']} ({facts['len']} samples) with {facts['sampler']}"
                        + (f"; world size in this run {world}" if world else ""),
                        f"iterated at {fmt_loc(facts['location'])}",
                    ],
                    fix="sampler = DistributedSampler(dataset, shuffle=True)\n"
                    "loader = DataLoader(dataset, batch_size=bs, sampler=sampler)\n"
                    "for epoch in range(epochs):\n    sampler.set_epoch(epoch)",
                    location=facts["location"],
                )
        for sampler_id, epochs in self._iters.items():
            if sampler_id not in self._epoch_set and len(epochs) >= 2 and len(set(epochs)) < len(epochs):
                yield dist_static.SAMPLER_SET_EPOCH_MISSING.finding(
                    "A shuffling DistributedSampler was iterated several times with the same epoch: set_epoch() is "
                    "not called, so every epoch uses the same order.",
                    evidence=[
                        f"{len(epochs)} passes over the sampler, epochs seen: {sorted(set(epochs))}",
                        f"iterated at {fmt_loc(self._sampler_loc)}",
                    ],
                    fix="for epoch in range(epochs):\n    sampler.set_epoch(epoch)\n    for batch in loader: ...",
                    location=self._sampler_loc,
                )
                break


_DDP_UNUSED_ERROR = "Expected to have finished reduction in the prior iteration"


DDP_FIND_UNUSED_PARAMETERS = RuleInfo(
    slug="ddp-find-unused-parameters",
    severity=Severity.WARNING,
    category="distributed",
    summary="find_unused_parameters set without need, or missing when needed",
    kinds=("runtime",),
)


class DdpFindUnusedParameters(RuntimeRule):
    """find_unused_parameters=True while every parameter gets a gradient (wasted work), or False when some never do."""

    info = DDP_FIND_UNUSED_PARAMETERS

    def __init__(self) -> None:
        super().__init__()
        self.flag: bool | None = None
        self.steps = 0
        self.steps_with_unused = 0
        self.unused_names: set[str] = set()
        self.location: Location | None = None
        self._model: Any = None

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if root and self.flag is None and _is_ddp(module):
            self.flag = bool(getattr(module, "find_unused_parameters", False))
            self._names = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
            self.location = user_location()

    def on_optimizer_step_pre(self, optimizer: Any) -> None:
        if self.flag is None:
            return
        self.steps += 1
        unused = [n for n, p in self._names if p.grad is None]
        if unused:
            self.steps_with_unused += 1
            self.unused_names.update(unused[:20])

    def findings(self, record: Any) -> Iterator[Finding]:
        self._names = []
        crashed = record is not None and _DDP_UNUSED_ERROR in str(record.error or "")
        if self.flag is False and (crashed or self.steps_with_unused):
            yield DDP_FIND_UNUSED_PARAMETERS.finding(
                "Some parameters get no gradient in a step while DDP waits for all of them "
                "(find_unused_parameters=False): DDP fails or hangs on the next iteration.",
                evidence=([f"the script failed with: {record.error}"] if crashed else [])
                + (
                    [f"parameters without gradient: {', '.join(sorted(self.unused_names)[:6])}"]
                    if self.unused_names
                    else []
                ),
                fix="model = DDP(model, device_ids=[local_rank], find_unused_parameters=True)\n"
                "# better: make every parameter take part in the loss, or remove the unused ones",
                location=self.location,
            )
        elif self.flag is True and self.steps >= 3 and not self.steps_with_unused:
            yield DDP_FIND_UNUSED_PARAMETERS.finding(
                "find_unused_parameters=True although every parameter received a gradient at every step: DDP "
                "walks the autograd graph after each forward for nothing.",
                evidence=[f"all parameters had gradients at {self.steps} optimizer steps"],
                fix="model = DDP(model, device_ids=[local_rank])   # find_unused_parameters=False (default)",
                location=self.location,
            )


class DataParallelUsed(_RootScan):
    """A root model that is nn.DataParallel."""

    info = dist_static.DATAPARALLEL_USED

    def __init__(self) -> None:
        super().__init__()
        self.location: Location | None = None
        self.seen = False

    def scan(self, root: torch.nn.Module) -> None:
        if isinstance(root, torch.nn.DataParallel):
            self.seen = True
            self.location = user_location()

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.seen:
            yield dist_static.DATAPARALLEL_USED.finding(
                "The model runs under nn.DataParallel: one Python thread scatters inputs and replicates the model "
                "every step; DistributedDataParallel is faster even on one machine.",
                evidence=[f"nn.DataParallel called at {fmt_loc(self.location)}"],
                fix="# torchrun --nproc_per_node N train.py\ndist.init_process_group('nccl')\n"
                "model = DDP(model.to(local_rank), device_ids=[local_rank])",
                location=self.location,
            )


class OptimizerBeforeFsdp(RuntimeRule):
    """An optimizer whose parameters are not the FSDP-sharded model's parameters."""

    info = fsdp_static.OPTIMIZER_BEFORE_FSDP
    supersedes = ("param-not-in-optimizer", "cannot-overfit-batch")
    """The same cause (the optimizer holds stale tensors, nothing trains), reported once."""

    def __init__(self) -> None:
        super().__init__()
        self.stale = 0
        self.model_params = 0
        self.location: Location | None = None
        self._checked = False

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if self._checked:
            return
        self._checked = True
        roots = [r for r in list(getattr(self.session, "root_modules", ()) or ()) if _is_fsdp(r)]
        if not roots:
            return
        model = {id(p) for r in roots for p in r.parameters()}
        held = optimizer_params([optimizer])
        self.model_params = len(model)
        self.stale = sum(1 for p in held if id(p) not in model)
        if self.stale:
            self.location = user_location()

    def findings(self, record: Any) -> Iterator[Finding]:
        if not self.stale:
            return
        yield fsdp_static.OPTIMIZER_BEFORE_FSDP.finding(
            "The optimizer holds parameters that are not the FSDP model's: it was built before the model was "
            "sharded (fully_shard() replaces the parameters with sharded DTensors, FullyShardedDataParallel() "
            "flattens them into FlatParameters). The model never trains.",
            evidence=[
                f"{self.stale} optimizer parameter(s) are not among the {self.model_params} sharded parameters",
                f"optimizer step at {fmt_loc(self.location)}",
            ],
            fix="fully_shard(model)                       # first\noptimizer = torch.optim.AdamW(model.parameters())  # then",
            location=self.location,
        )

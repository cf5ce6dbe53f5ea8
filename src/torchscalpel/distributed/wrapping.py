"""``wrap(model, strategy=...)``: DDP or FSDP2 set up the way experience says.

A model FSDP1 (``FullyShardedDataParallel``) already wraps is refused with the FSDP2 form of each of its settings
(:func:`fsdp1_advice`); :func:`script_advice` says the same for a script's FSDP1 calls, read from its source.

- DDP: SyncBatchNorm when the model has BatchNorm and runs on CUDA (it cannot run on CPU);
  ``find_unused_parameters`` decided by measuring one backward on a sample batch instead of
  guessing (turning it on costs a graph walk every step, leaving it off crashes the second step
  of a model with unused parameters).
- FSDP2: ``fully_shard`` on every repeated block (:mod:`torchscalpel.blocks`, the definition
  ``scalpel plan`` and ``scalpel tune`` use too), then on the root, with a ``MixedPrecisionPolicy``.
- Activation checkpointing and ``torch.compile`` per block, keeping parameter names unchanged
  (no ``_checkpoint_wrapped_module.`` or ``_orig_mod.`` in checkpoints).
"""

from __future__ import annotations

import functools
import gc
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from torchscalpel.blocks import find_blocks as _find_blocks
from torchscalpel.distributed.process import collective_device, get_logger
from torchscalpel.errors import UsageError
from torchscalpel.runtime.fsdpwrap import FsdpWrap
from torchscalpel.runtime.fsdpwrap import from_module as fsdp1_from_module

STRATEGIES = ("auto", "ddp", "fsdp", "none")
_BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
log = get_logger()


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks ``wrap`` shards, checkpoints and compiles, outermost first; ``[]`` when none.

    The one definition of :func:`torchscalpel.blocks.find_blocks` (``scalpel plan`` prices the
    same FSDP units): instances of the module class the forward calls repeatedly (transformer
    layers, not the Linears inside them), never a ``ModuleList``/``ModuleDict`` container.
    """
    return [module for _, module in _find_blocks(model)]


def _is_optimizer(obj: object) -> bool:
    """``isinstance(obj, Optimizer)`` for anything the garbage collector lists: a ``weakref.proxy`` whose
    object is gone raises ``ReferenceError`` on isinstance (seen when earlier code in the process left one)."""
    try:
        return isinstance(obj, torch.optim.Optimizer)
    except ReferenceError:
        return False


def optimizers_holding(model: nn.Module) -> list[torch.optim.Optimizer]:
    """Optimizers alive in this process that already hold one of ``model``'s parameters."""
    ids = {id(p) for p in model.parameters()}
    found = []
    with warnings.catch_warnings():
        # isinstance() on some of torch's deprecated module-level objects warns; not our business.
        warnings.simplefilter("ignore")
        optimizers = [o for o in gc.get_objects() if _is_optimizer(o)]
    for obj in optimizers:
        if any(id(p) in ids for group in obj.param_groups for p in group["params"]):
            found.append(obj)
    return found


def sync_batchnorm_decision(model: nn.Module, device: torch.device) -> tuple[bool, str]:
    """Whether to convert BatchNorm to SyncBatchNorm, and why (one line for the log)."""
    has_bn = any(isinstance(m, _BN_TYPES) for m in model.modules())
    if not has_bn:
        return False, "no BatchNorm layers"
    if device.type != "cuda":
        return False, (
            "BatchNorm found but SyncBatchNorm only runs on CUDA; each rank keeps per-rank batch statistics "
            "(the per-rank batch is what normalises)"
        )
    return True, "BatchNorm found on CUDA: converted to SyncBatchNorm so statistics cover the global batch"


def _float_outputs(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _float_outputs(v)]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [t for v in value for t in _float_outputs(v)]
    if hasattr(value, "__dict__"):
        return [t for v in vars(value).values() for t in _float_outputs(v)]
    return []


def _to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor in it moved to ``device``: users build the sample batch before
    ``wrap`` moves the model, so it is usually still on the CPU."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, value)


def unused_parameters(model: nn.Module, sample: Any) -> list[str]:
    """Names of trainable parameters that get no gradient from one forward on ``sample``.

    Runs in train mode under a forked RNG with buffers restored afterwards, and uses
    ``autograd.grad`` so no ``.grad`` is touched: the measurement leaves the model and the random
    streams exactly as they were.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        return []
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            args, kwargs = (sample, {}) if not isinstance(sample, Mapping) else ((), dict(sample))
            out = model(*args, **kwargs) if isinstance(args, tuple) else model(args, **kwargs)
            outputs = _float_outputs(out)
            if not outputs:
                raise UsageError(
                    "wrap(sample=...) ran the model but its output holds no tensor that requires grad; "
                    "pass a batch the model trains on, or find_unused_parameters=True/False explicitly."
                )
            total = cast(torch.Tensor, sum(o.float().sum() for o in outputs))  # outputs is not empty
            grads = torch.autograd.grad(total, [p for _, p in named], allow_unused=True)
    finally:
        with torch.no_grad():
            for name, buf in model.named_buffers():
                buf.copy_(buffers[name])
    return [n for (n, _), g in zip(named, grads, strict=True) if g is None]


def _resolve_dtype(mixed_precision: str | torch.dtype | None) -> torch.dtype | None:
    if mixed_precision is None or isinstance(mixed_precision, torch.dtype):
        return mixed_precision
    table = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }
    if mixed_precision not in table:
        raise UsageError(f"mixed_precision={mixed_precision!r} is not one of bf16, fp16 or a torch dtype.")
    return table[mixed_precision]


def choose_strategy(model: nn.Module, world_size: int, device: torch.device) -> tuple[str, str]:
    """What ``strategy="auto"`` picks, and why.

    One rank: no wrapper. On CUDA, FSDP when fp32 weights + gradients + Adam state (16 bytes per
    parameter) would take more than half of one device, else DDP (cheaper communication). On CPU:
    DDP.
    """
    if world_size == 1:
        return "none", "one rank: nothing to replicate or shard"
    n = sum(p.numel() for p in model.parameters())
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        need = 16 * n
        if need > total // 2:
            return (
                "fsdp",
                f"{n:,} parameters need ~{need / 2**30:.1f} GiB for training state, over half of the device",
            )
        return "ddp", f"{n:,} parameters fit on each device with room for activations"
    return "ddp", "CPU: DDP (FSDP on CPU only saves memory, at a communication cost)"


def _apply_checkpointing(blocks: list[nn.Module]) -> None:
    """Recompute each block's activations in backward; parameter names stay the same."""
    for block in blocks:
        # Why use_reentrant=False: works with kwargs, with FSDP2 hooks, and preserves the RNG
        # state so dropout masks in the recomputation are the ones of the forward pass.
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def _broadcast_from_rank0(model: nn.Module) -> None:
    """Make every rank start from rank 0's weights (DDP does this itself; FSDP2 does not)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0)


def wrap(
    model: nn.Module,
    strategy: str = "auto",
    *,
    mixed_precision: str | torch.dtype | None = None,
    activation_checkpointing: bool = False,
    compile: bool | dict[str, Any] = False,
    find_unused_parameters: bool | None = None,
    sample: Any = None,
    sync_batchnorm: bool | None = None,
) -> nn.Module:
    """Wrap ``model`` for data-parallel training; build the optimizer from the result afterwards.

    ``strategy``: ``ddp``, ``fsdp`` (FSDP2 ``fully_shard`` per block, root last), ``none`` or
    ``auto`` (see :func:`choose_strategy`). ``mixed_precision``: ``"bf16"``/``"fp16"``/dtype,
    an FSDP ``MixedPrecisionPolicy`` (fp32 gradient reduction) or autocast around DDP's forward.
    ``find_unused_parameters``: measured on ``sample`` when None and a sample is given, else
    False. ``sync_batchnorm``: None decides by :func:`sync_batchnorm_decision`.

    Raises :class:`UsageError` when an optimizer already holds the model's parameters: FSDP
    replaces them, so the optimizer would update tensors nobody uses.
    """
    from torchscalpel.distributed.process import context

    if strategy not in STRATEGIES:
        raise UsageError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}.")
    fsdp1 = fsdp1_from_module(model)
    if fsdp1 is not None:
        raise UsageError(f"wrap() got a model FSDP1 already wraps. {fsdp1_advice(fsdp1)}")
    holders = optimizers_holding(model)
    if holders:
        raise UsageError(
            f"An optimizer ({type(holders[0]).__name__}) was built before wrap(); build it after: "
            "opt = torch.optim.AdamW(wrap(model).parameters()), because wrapping may replace the parameters."
        )
    ctx = context()
    model = model.to(ctx.device)
    if strategy == "auto":
        strategy, why = choose_strategy(model, ctx.world_size, ctx.device)
        log.info("wrap: strategy=%s (%s)", strategy, why)
    dtype = _resolve_dtype(mixed_precision)
    blocks = find_blocks(model)
    if (activation_checkpointing or compile) and not blocks:
        log.warning(
            "wrap: no repeated block found; activation checkpointing/compile apply to the whole model"
        )
    if activation_checkpointing:
        _apply_checkpointing(blocks or [model])
    if strategy == "fsdp":
        wrapped = _wrap_fsdp(model, blocks, dtype)
    elif strategy == "ddp":
        wrapped = _wrap_ddp(model, ctx.device, dtype, find_unused_parameters, sample, sync_batchnorm)
    else:
        wrapped = model
        if dtype is not None:
            _autocast_forward(model, ctx.device, dtype)
    if compile:
        options = compile if isinstance(compile, dict) else {}
        for block in blocks or [wrapped]:
            block.compile(**options)  # in place: state-dict keys keep their names
    return wrapped


def fsdp1_advice(fsdp1: FsdpWrap) -> str:
    """What ``wrap`` says about a ``FullyShardedDataParallel(...)`` wrap (a live wrapper, or a script's call read by
    :func:`script_advice`): the same sharding with ``wrap`` / ``fully_shard`` (FSDP2), setting by setting."""
    where = f" at {fsdp1.site}" if fsdp1.site else ""
    lines = [
        f"{fsdp1.describe()}{where} is FSDP1; wrap() shards with FSDP2 (fully_shard per block, then the root) and "
        "takes the unwrapped model: pass the model itself, before any FSDP1 wrap and before the optimizer."
    ]
    mp = (
        f', mixed_precision="{"bf16" if fsdp1.precision == "bf16-mixed" else "fp16"}"'
        if fsdp1.precision
        else ""
    )
    if fsdp1.strategy == "fsdp-full":
        lines.append(f'FULL_SHARD is wrap(model, strategy="fsdp"{mp}).')
    elif fsdp1.strategy == "fsdp-grad-op":
        lines.append(
            "SHARD_GRAD_OP (parameters kept gathered between forward and backward) is fully_shard(block, "
            "reshard_after_forward=False) on each block and the root; wrap() reshards after forward."
        )
    elif fsdp1.strategy == "ddp":
        lines.append(
            f'NO_SHARD keeps a full copy of every state on every rank, as DDP does: wrap(model, strategy="ddp"{mp}) '
            "communicates less for the same memory."
        )
    else:
        lines.append(
            "HYBRID_SHARD (shard within a node, replicate across nodes) is fully_shard(block, mesh=mesh) over a 2-D "
            'init_device_mesh("cuda", (nodes, ranks_per_node), mesh_dim_names=("replicate", "shard")).'
        )
    if fsdp1.param_dtype:
        lines.append(
            f"MixedPrecision(param_dtype={fsdp1.param_dtype}) is FSDP2's MixedPrecisionPolicy(param_dtype=..., "
            "reduce_dtype=torch.float32), which wrap() sets from mixed_precision (fp32 gradient reduction)."
        )
    if fsdp1.cpu_offload:
        lines.append(
            "CPUOffload(offload_params=True) is fully_shard(..., offload_policy=CPUOffloadPolicy()): keep it only if "
            "the sharded states do not fit on the device (scalpel plan says so); every step copies them over PCIe."
        )
    if fsdp1.ignored_modules:
        lines.append(
            f"ignored_modules={', '.join(fsdp1.ignored_modules)} is fully_shard(..., ignored_params=set(...)) with "
            "those modules' parameters: they stay whole on every rank."
        )
    lines.append(
        "model.clip_grad_norm_(max_norm) on the FSDP1 wrapper is torch.nn.utils.clip_grad_norm_ under FSDP2."
    )
    return " ".join(lines)


def script_advice(path: str | Path) -> list[str]:
    """``wrap``'s advice for each ``FullyShardedDataParallel(...)`` call in the script at ``path``, read from its
    source (running it would need a process group, and FSDP1 an accelerator). Empty when it has none."""
    from torchscalpel.runtime.fsdpwrap import read_source

    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"Cannot read {source}: {getattr(exc, 'strerror', None) or exc}; give the path of a Python script."
        ) from None
    return [fsdp1_advice(w) for w in read_source(text, str(source))]


def _autocast_forward(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    model.forward = torch.autocast(device.type, dtype=dtype)(model.forward)


def _wrap_ddp(
    model: nn.Module,
    device: torch.device,
    dtype: torch.dtype | None,
    find_unused: bool | None,
    sample: Any,
    sync_bn: bool | None,
) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    convert, why = sync_batchnorm_decision(model, device)
    if sync_bn is not None:
        convert, why = sync_bn, "set by the caller"
    if convert:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    log.info("wrap: SyncBatchNorm %s (%s)", "on" if convert else "off", why)
    if find_unused is None:
        if sample is not None:
            unused = unused_parameters(model, _to_device(sample, device))
            flag = torch.tensor([1.0 if unused else 0.0], device=collective_device())
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank must pass the same flag to DDP
            find_unused = bool(flag.item())
            log.info(
                "wrap: find_unused_parameters=%s (measured: %s)",
                find_unused,
                f"{len(unused)} unused, e.g. {unused[0]}" if unused else "every parameter gets a gradient",
            )
        else:
            find_unused = False
    if dtype is not None:
        _autocast_forward(model, device, dtype)
    device_ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=device_ids, find_unused_parameters=find_unused)


def _wrap_fsdp(model: nn.Module, blocks: list[nn.Module], dtype: torch.dtype | None) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from torchscalpel.distributed.process import context

    ctx = context()
    _broadcast_from_rank0(model)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    # Why fp32 reduction: summing bf16 gradients over many ranks loses the small ones.
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype is not None else None)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    log.info(
        "wrap: FSDP2 over %d ranks, %d blocks of %s",
        ctx.world_size,
        len(blocks),
        type(blocks[0]).__name__ if blocks else "-",
    )
    return model

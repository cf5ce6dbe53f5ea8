"""Run training steps on fake tensors and measure, storage by storage, what the step keeps alive.

The model is built on the meta device, moved to fake tensors, and run for two optimizer steps
(forward, loss, backward, ``optimizer.step``, ``zero_grad(set_to_none=True)``) under
:class:`~torchscalpel.plan.tracker.SimulationTracker`, so the second step is the steady state with
optimizer states alive. Nothing is allocated for real: a 7B model plans on a laptop. Saved-tensor
hooks count what autograd keeps for backward (reported as "saved for backward"); the tracker's
timeline gives the peak of everything live, temporaries included.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map

from torchscalpel.blocks import find_blocks
from torchscalpel.errors import UsageError
from torchscalpel.plan.fake_guards import causal_masks_undetected, quiet_fake_logs
from torchscalpel.plan.model_io import LossFn, default_loss, plain_tensor_attributes, unique_params
from torchscalpel.plan.names import OPTIMIZERS, Precision
from torchscalpel.plan.spec import BatchSpec
from torchscalpel.plan.tracker import SimulationTracker, Timeline
from torchscalpel.plan.units import checkpointed_blocks, nbytes, unit_marks


@dataclass(kw_only=True, slots=True)
class OptimizerSpec:
    """An optimizer class by dotted name and its keyword arguments (no params)."""

    cls: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def named(cls, name: str) -> OptimizerSpec:
        """The spec for an ``--optimizer`` name."""
        try:
            path, kwargs = OPTIMIZERS[name]
        except KeyError:
            raise UsageError(f"Unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}.") from None
        return cls(cls=path, kwargs=dict(kwargs))

    @property
    def label(self) -> str:
        """Short name for tables."""
        return self.cls.rsplit(".", 1)[-1] or "none"

    def build(self, params: list[nn.Parameter], *, foreach: bool | None) -> torch.optim.Optimizer | None:
        """The optimizer over ``params`` (``foreach`` forced when the target device defaults to it)."""
        if not self.cls or not params:
            return None
        module_name, _, name = self.cls.rpartition(".")
        import importlib

        klass = getattr(importlib.import_module(module_name), name)
        kwargs = dict(self.kwargs)
        accepts = inspect.signature(klass.__init__).parameters
        if foreach is not None and "foreach" in accepts and kwargs.get("foreach") is None:
            kwargs["foreach"] = foreach
        kwargs = {
            k: v
            for k, v in kwargs.items()
            if k in accepts or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepts.values())
        }
        return klass(params, **kwargs)


@dataclass(kw_only=True, slots=True)
class SimSettings:
    """What one simulated step looks like."""

    optimizer: OptimizerSpec
    precision: Precision = Precision.FP32
    """A name from ``--precision`` is accepted and checked here, once (UsageError when unknown)."""
    checkpoint_blocks: bool = False
    grad_accum: int = 1
    foreach: bool | None = None
    """Force the optimizer's foreach path (CUDA's default) when simulating for a GPU on CPU."""
    device: str = "cpu"

    def __post_init__(self) -> None:
        self.precision = Precision.parse(self.precision)


@dataclass(kw_only=True, slots=True)
class Measurement:
    """What one simulation measured; ``timeline`` feeds the strategy model."""

    batch: int
    timeline: Timeline
    param_bytes: int
    trainable_bytes: int
    buffer_bytes: int
    grad_bytes: int
    optim_bytes: int
    input_bytes: int
    saved_bytes: int
    peak_bytes: int
    act_peak_bytes: int
    blocks: list[tuple[str, int]]
    """(block name, trainable parameter bytes) for each block."""
    root_param_bytes: int
    """Trainable parameter bytes outside every block (embeddings, heads): FSDP's root unit."""
    param_count: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form (without the timeline)."""
        return {
            "batch": self.batch,
            "param_bytes": self.param_bytes,
            "trainable_bytes": self.trainable_bytes,
            "buffer_bytes": self.buffer_bytes,
            "grad_bytes": self.grad_bytes,
            "optim_bytes": self.optim_bytes,
            "input_bytes": self.input_bytes,
            "saved_bytes": self.saved_bytes,
            "peak_bytes": self.peak_bytes,
            "act_peak_bytes": self.act_peak_bytes,
            "param_count": self.param_count,
            "blocks": len(self.blocks),
            "largest_block_bytes": max((b for _, b in self.blocks), default=0),
            "root_param_bytes": self.root_param_bytes,
        }


ModelBuilder = Callable[[], nn.Module]


def build_meta_model(builder: ModelBuilder, precision: Precision | str) -> nn.Module:
    """Call the factory with the meta device as default, so no parameter memory is allocated."""
    try:
        with quiet_fake_logs(), torch.device("meta"):
            model = builder()
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"The model factory raised {type(exc).__name__}: {_one_line(exc)}.") from None
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"The model factory returned {type(model).__name__}, not a torch.nn.Module; return the model."
        )
    return model


def simulate(
    meta_builder: Callable[[], nn.Module],
    batch: BatchSpec,
    settings: SimSettings,
    loss_fn: LossFn | None = None,
    *,
    steps: int = 2,
) -> Measurement:
    """Run ``steps`` training steps of a fresh meta model from ``meta_builder`` on fake tensors; measure them.

    The model is rebuilt for every simulation rather than deep-copied: models keep plain tensor
    attributes (rotary caches, ...) that do not survive a deep copy, and a fresh build is cheap on meta.
    """
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = SimulationTracker()
    try:
        with quiet_fake_logs(), fake_mode:
            model = _to_fake(meta_builder(), settings.device, _WHOLE_MODEL_DTYPES.get(settings.precision))
        for p in model.parameters():
            tracker.label(p, "parameters")
        for b in model.buffers():
            tracker.label(b, "buffers")
        for _module, _name, tensors in plain_tensor_attributes(model):
            for t in tensors:  # held by the model like a buffer; a parameter keeps its own label
                if not isinstance(t, nn.Parameter):
                    tracker.label(t, "buffers")
        # The FSDP / checkpointing units dist.wrap uses (torchscalpel.blocks); with no block, as
        # wrap does, the root is the only FSDP unit and checkpointing wraps the whole model.
        blocks = find_blocks(model)
        params = [p for p in unique_params(model) if p.requires_grad]
        with (
            quiet_fake_logs(),
            causal_masks_undetected(),
            fake_mode,
            tracker,
            checkpointed_blocks(blocks or [("", model)], settings.checkpoint_blocks),
            unit_marks(model, blocks, tracker),
        ):
            optimizer = settings.optimizer.build(params, foreach=settings.foreach)
            saved: dict[int, int] = {}
            for _ in range(steps):
                _one_step(model, batch, settings, loss_fn, optimizer, tracker, saved)
    except UsageError:
        raise
    except Exception as exc:
        if os.environ.get("SCALPEL_DEBUG"):
            raise
        raise _fake_error(exc, tracker.failed_op) from None
    timeline = tracker.timeline()
    return _summarise(model, batch, timeline, tracker, saved, blocks, params)


def _to_fake(meta_model: nn.Module, device: str, float_dtype: torch.dtype | None = None) -> nn.Module:
    """Move a meta model's parameters and buffers to fake tensors on ``device``, in place.

    Parameters are replaced one by one instead of ``to_empty`` (whose tensor swap fails for some
    models); a memo keyed by the meta tensor keeps tied weights one storage. ``float_dtype`` casts
    floating-point tensors (``--precision bf16``: the whole model in bf16).
    """
    model = meta_model
    memo: dict[int, torch.Tensor] = {}

    def fake_like(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            dtype = float_dtype if float_dtype is not None and t.is_floating_point() else t.dtype
            memo[id(t)] = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device=device)
        return memo[id(t)]

    params: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in params:
                params[id(p)] = nn.Parameter(fake_like(p), requires_grad=p.requires_grad)
            module._parameters[name] = params[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = fake_like(b)
    # Plain tensor attributes (Lightning's demo ``self.src_mask``) follow the model to the device but keep
    # their dtype, as ``model.to(dtype)`` leaves them; one that is a parameter or buffer stays that object.
    for module, name, _tensors in plain_tensor_attributes(model):

        def swap(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            if id(t) in params:
                return params[id(t)]
            if id(t) not in memo:
                memo[id(t)] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
            return memo[id(t)]

        module.__dict__[name] = tree_map(swap, module.__dict__[name])
    return model


def _needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """True for optimizers whose ``step`` requires a closure (LBFGS)."""
    param = inspect.signature(type(optimizer).step).parameters.get("closure")
    return param is not None and param.default is inspect.Parameter.empty


def _closure_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """The steady-state memory of a closure optimizer, allocated rather than stepped.

    Why not step: LBFGS reads ``float(loss)`` and takes data-dependent line-search branches,
    which fake tensors cannot run. Its state at a full history is ``2 * history_size`` flat
    vectors (directions and steps) plus the direction, the previous flat gradient and the
    current flat gradient, each the size of all parameters; other closure optimizers get one
    flat vector (a guess: their state is not known here).
    """
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if not params:
        return
    first = params[0]
    state = optimizer.state[first]
    if "scalpel_flat_state" in state:
        # the history is bounded and reused: allocating it again each simulated step held two copies at once
        # (an LBFGS step planned at 100 MiB of state where torch keeps 50.5)
        return
    numel = sum(p.numel() for p in params)
    state["scalpel_flat_state"] = [
        torch.empty(numel, dtype=first.dtype, device=first.device)
        for _ in range(closure_state_vectors(optimizer))
    ]


def closure_state_vectors(optimizer: torch.optim.Optimizer) -> int:
    """Flat parameter-sized vectors a closure optimizer keeps at steady state (see _closure_optimizer_state)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        return 2 * int(optimizer.param_groups[0].get("history_size", 0)) + 3
    return 1


def _one_step(model, batch, settings, loss_fn, optimizer, tracker, saved) -> None:
    """zero_grad, ``grad_accum`` micro-batches (at most 2: the second is the steady state), step."""
    tracker.set_phase("zero_grad")
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    for _ in range(min(settings.grad_accum, 2)):
        tracker.set_phase("data")
        tensors = batch.make(settings.device)
        whole = _WHOLE_MODEL_DTYPES.get(settings.precision)
        if whole is not None:
            tensors = {k: v.to(whole) if v.dtype.is_floating_point else v for k, v in tensors.items()}
        for t in tensors.values():
            tracker.label(t, "inputs")
        tracker.set_phase("forward")

        def pack(t: torch.Tensor) -> torch.Tensor:
            # saved for backward: an activation, as scalpel memory files it (a parameter or input stays one)
            index = tracker.track(t, "activations", only_from="temporaries")
            if index is not None:
                saved[index] = tracker.records[index].nbytes
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast(settings):
            if loss_fn is not None:
                out, loss = None, loss_fn(model, tensors)
            else:
                out, loss = default_loss(model, tensors)
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise UsageError(
                "The loss does not require grad (no trainable parameter reaches it); check the model or --loss."
            )
        if settings.precision == Precision.FP16_MIXED:
            loss = loss * 65536.0  # GradScaler's scaled loss: one scalar, same graph
        tracker.set_phase("backward")
        loss.float().backward() if loss.dim() == 0 else loss.float().sum().backward()
        # A training loop keeps the output and loss alive until the next iteration rebinds them.
        del tensors
    tracker.set_phase("optimizer")
    if optimizer is not None:
        if _needs_closure(optimizer):
            _closure_optimizer_state(optimizer)
        else:
            optimizer.step()
        for state in optimizer.state.values():
            for value in state.values():
                for tensor in value if isinstance(value, list) else [value]:
                    if isinstance(tensor, torch.Tensor):
                        tracker.label(tensor, "optimizer_state")
    for p in model.parameters():
        if p.grad is not None:
            tracker.label(p.grad, "gradients")
    del out, loss
    tracker.set_phase("idle")


@contextlib.contextmanager
def _autocast(settings: SimSettings) -> Iterator[None]:
    dtype = _AUTOCAST_DTYPES.get(settings.precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=settings.device, dtype=dtype):
        yield


_WHOLE_MODEL_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP64: torch.float64}
"""Precisions that put the whole model (and float inputs) in one dtype."""

_AUTOCAST_DTYPES = {Precision.BF16_MIXED: torch.bfloat16, Precision.FP16_MIXED: torch.float16}
"""The ``*-mixed`` precisions: autocast's dtype over fp32 parameters."""


def _summarise(model, batch, timeline: Timeline, tracker, saved, blocks, params) -> Measurement:
    records = tracker.records
    total = timeline.total()
    train_mask = timeline.in_phases(("forward", "backward"))
    act = timeline.bytes["activations"] + timeline.bytes["temporaries"]
    label_bytes = {
        label: sum(r.nbytes for r in records if r.category == label and r.end is None)
        for label in ("parameters", "buffers", "gradients", "optimizer_state")
    }
    block_params = {id(p) for _, b in blocks for p in b.parameters()}
    trainable = sum(nbytes(p) for p in params)
    return Measurement(
        batch=batch.batch_size,
        timeline=timeline,
        param_bytes=label_bytes["parameters"],
        trainable_bytes=trainable,
        buffer_bytes=label_bytes["buffers"],
        grad_bytes=label_bytes["gradients"],
        optim_bytes=label_bytes["optimizer_state"],
        input_bytes=sum(r.nbytes for r in records if r.category == "inputs")
        // max(1, _count_steps(timeline)),
        saved_bytes=sum(n for i, n in saved.items() if records[i].category in ("activations", "temporaries"))
        // max(1, _count_steps(timeline)),
        peak_bytes=int(total.max()) if total.size else 0,
        act_peak_bytes=int(act[train_mask].max()) if train_mask.any() else 0,
        blocks=[(name, sum(nbytes(p) for p in unique_params(b) if p.requires_grad)) for name, b in blocks],
        root_param_bytes=sum(nbytes(p) for p in params if id(p) not in block_params),
        param_count=sum(p.numel() for p in unique_params(model)),
    )


def _count_steps(timeline: Timeline) -> int:
    """Number of forward phases entered (micro-batches over all steps)."""
    if "forward" not in timeline.phase_names:
        return 1
    fid = timeline.phase_names.index("forward")
    starts = np.flatnonzero((timeline.phase == fid) & (np.r_[-1, timeline.phase[:-1]] != fid))
    return max(1, len(starts))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300].rstrip(".")  # the sentence adds its own full stop


def _fake_error(exc: BaseException, failed_op: str | None) -> UsageError:
    """One sentence for a model that cannot run on fake tensors, naming the op when known."""
    op = getattr(exc, "func", None) or failed_op
    from torch._subclasses import fake_tensor as ft

    fake_kinds = (
        ft.UnsupportedOperatorException,
        ft.DataDependentOutputException,
        ft.DynamicOutputShapeException,
    )
    if isinstance(exc, fake_kinds):
        return UsageError(
            f"The model cannot run on fake tensors: op {op} needs real data ({type(exc).__name__}); "
            "plan it with script mode on a real batch or make that step shape-only."
        )
    where = f" in op {op}" if op else ""
    return UsageError(
        f"Running the model on the batch under fake tensors failed{where}: {type(exc).__name__}: {_one_line(exc)}."
    )


def sim_settings_for(
    optimizer: OptimizerSpec, precision: Precision | str, grad_accum: int, device: Any
) -> SimSettings:
    """Simulation settings for a target device (fake CUDA only where CUDA exists; foreach as CUDA does)."""
    gpu_target = device.kind in ("cuda", "rocm")
    sim_device = "cuda" if gpu_target and torch.cuda.is_available() else "cpu"
    return SimSettings(
        optimizer=optimizer,
        precision=Precision.parse(precision),
        grad_accum=grad_accum,
        foreach=True if gpu_target else None,
        device=sim_device,
    )

"""Script mode: plan the model, optimizer and batch a script uses at its first training step.

:class:`PlanObserver` watches the run through the runtime's observer API: the first root forward
call gives the model and its inputs (shapes, dtypes, integer ranges), the first DataLoader batch
gives targets that the model did not receive (so the loss is cross-entropy / MSE like the script's),
autocast state and parameter dtype give the precision, backward calls before the first optimizer
step give gradient accumulation, and the optimizer that steps gives its class and hyperparameters.
After that first step it asks the runtime to stop. The plan is then made on fake tensors exactly as
in factory mode; the live model is only read for shapes (a meta copy, no data copied).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from torchscalpel.errors import UsageError
from torchscalpel.plan.model_io import loss_from_output
from torchscalpel.plan.simulate import OptimizerSpec
from torchscalpel.plan.spec import BatchSpec, TensorSpec
from torchscalpel.runtime.observer import Observer

MAX_BACKWARDS_WITHOUT_STEP = 64
"""A script whose optimizer has not stepped after this many backward calls updates by hand."""


class PlanObserver(Observer):
    """Captures model, inputs, targets, precision, accumulation and optimizer; stops after step 1."""

    name = "plan"

    def __init__(self) -> None:
        self.session: Any = None
        self.model: nn.Module | None = None
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.batch: Any = None
        self.autocast: torch.dtype | None = None
        self.backwards = 0
        self.optimizer: OptimizerSpec | None = None
        self._trained = False  # a backward was seen: the forward and batch before it are the training ones

    def on_start(self, session: Any) -> None:
        self.session = session

    def on_batch(self, batch: Any, loader: Any) -> None:
        if not self._trained:
            self.batch = batch

    def on_forward_pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], root: bool) -> None:
        # The last root forward before the first backward is the training one: earlier calls may
        # be probes on a different batch (DDP's unused-parameter check, a sanity forward, eval).
        if not root or self._trained:
            return
        if not any(p.requires_grad for p in module.parameters()):
            return  # a loss module (nn.CrossEntropyLoss) or a frozen teacher: not the model being trained
        # Under DDP the root module is the wrapper; plan the model it holds (the strategy rows add
        # DDP's own buffers). Same inputs: DDP passes them through unchanged.
        if isinstance(module, DistributedDataParallel):
            module = module.module
        self.model, self.args, self.kwargs = module, args, dict(kwargs)
        device = next((p.device.type for p in module.parameters()), "cpu")
        if torch.is_autocast_enabled(device):
            self.autocast = torch.get_autocast_dtype(device)

    def on_backward_pre(self, tensors: tuple[torch.Tensor, ...]) -> None:
        if self.optimizer is None:
            self.backwards += 1
            self._trained = self.model is not None
            if self.backwards >= MAX_BACKWARDS_WITHOUT_STEP and self.session is not None:
                # Hand-written updates (no torch.optim): this many backward calls is enough to plan.
                self.session.request_stop("scalpel plan: no optimizer step after many backward calls")

    def on_optimizer_step_post(self, optimizer: torch.optim.Optimizer) -> None:
        if self.optimizer is not None:
            return
        klass = type(optimizer)
        hyper = {k: (float(v) if isinstance(v, torch.Tensor) and v.numel() == 1 else v)
                 for k, v in optimizer.param_groups[0].items() if k != "params"}
        hyper = {k: v for k, v in hyper.items() if not isinstance(v, torch.Tensor)}
        self.optimizer = OptimizerSpec(cls=f"{klass.__module__}.{klass.__qualname__}", kwargs=hyper)
        if self.session is not None:
            self.session.request_stop("scalpel plan: first optimizer step seen")

    # -- what the plan needs ---------------------------------------------------------------------
    def precision(self) -> str:
        """fp32 / bf16-mixed / fp16-mixed / bf16, from autocast and the parameters' dtype."""
        if self.autocast is torch.bfloat16:
            return "bf16-mixed"
        if self.autocast is torch.float16:
            return "fp16-mixed"
        assert self.model is not None
        dtypes = {p.dtype for p in self.model.parameters()}
        return "bf16" if dtypes == {torch.bfloat16} else "fp32"

    def inputs(self) -> tuple[BatchSpec, Any]:
        """The batch as a spec (entries argN / keyword names / targetN) and a loss function using it."""
        entries: list[TensorSpec] = []
        positional: list[tuple[str | None, Any]] = []
        for i, a in enumerate(self.args):
            positional.append((_add(entries, f"arg{i}", a), a))
        keywords: dict[str, tuple[str | None, Any]] = {k: (_add(entries, k, v), v) for k, v in self.kwargs.items()}
        given = {id(a) for a in self.args} | {id(v) for v in self.kwargs.values()}
        targets = [_add(entries, f"target{i}", t) for i, t in enumerate(_tensors(self.batch)) if id(t) not in given]
        targets = [t for t in targets if t]

        def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            args = [batch[name] if name else value for name, value in positional]
            kwargs = {k: batch[name] if name else value for k, (name, value) in keywords.items()}
            return loss_from_output(model(*args, **kwargs), [batch[t] for t in targets])

        return BatchSpec(tuple(entries)), loss_fn

    def meta_builder(self) -> Any:
        """A function returning a meta-device copy of the captured model (structure only, no data)."""
        model = self.model
        assert model is not None

        def build() -> nn.Module:
            memo: dict[int, Any] = {}
            for p in model.parameters():
                memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
            for b in model.buffers():
                memo[id(b)] = torch.empty_like(b, device="meta")
            try:
                return copy.deepcopy(model, memo)
            except Exception as exc:
                raise UsageError(f"Cannot copy the script's model structure for planning ({type(exc).__name__}: {exc}); "
                                 "use factory mode (--model MODULE:FACTORY).") from None

        return build


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        return [t for item in batch for t in _tensors(item)]
    return []


def _add(entries: list[TensorSpec], name: str, value: Any) -> str | None:
    """Append a spec for ``value`` if it is a tensor; the entry name, or None for non-tensors."""
    if not isinstance(value, torch.Tensor):
        return None
    high = None
    if not value.is_floating_point() and value.dtype != torch.bool and value.numel():
        high = int(value.max()) + 1  # token ids / class labels: keep embedding lookups in range
    entries.append(TensorSpec(name, value.dtype, tuple(value.shape), high))
    return name


def plan_script(args: argparse.Namespace, device: Any, strategies: list[str]) -> tuple[Any, Any, Path]:
    """Run the script to its first optimizer step, then plan what it used. Returns (plan, record, out dir)."""
    from torchscalpel.cli.common import default_run_dir, resolve_target
    from torchscalpel.cli.plan import sim_settings
    from torchscalpel.plan.planner import PlanRequest, make_plan
    from torchscalpel.runtime.session import RuntimeOptions, run_target

    target = resolve_target(args)
    out_dir = Path(args.out or default_run_dir(f"plan-{target.name}"))
    observer = PlanObserver()
    # No step count: forward-only steps before the optimizer exists (a sanity forward) must not end
    # the run; the observer stops it at the first optimizer step.
    record = run_target(target, RuntimeOptions(warmup=0, steps=None, out_dir=None, profile_steps=0,
                                               name=f"plan-{target.name}"), observers=[observer])
    if observer.model is None:
        raise UsageError(f"The script never called a model (status {record.status}); plan needs one training step to see it.")
    if observer.optimizer is None and args.optimizer == "adamw" and record.status == "failed":
        raise UsageError(f"The script failed before its first optimizer step ({record.error}); fix it or use factory mode.")
    optimizer = observer.optimizer or OptimizerSpec.named(args.optimizer)
    batch, loss_fn = observer.inputs()
    precision = observer.precision() if args.precision == "fp32" else args.precision
    seen_accum = max(1, observer.backwards) if observer.optimizer is not None else 1
    accum = seen_accum if args.grad_accum == 1 else args.grad_accum
    request = PlanRequest(
        builder=observer.meta_builder(), batch=batch, loss_fn=loss_fn, strategies=strategies,
        world_size=args.world_size, nodes=args.nodes, device=device, checkpointing=args.activation_checkpointing,
        search_max_batch=not args.no_max_batch, model_name=type(observer.model).__name__,
        settings=sim_settings(optimizer, precision, accum, device),
    )
    return make_plan(request), record, out_dir

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

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_flatten, tree_unflatten

from torchscalpel.errors import UsageError
from torchscalpel.plan.model_io import loss_from_output, plain_tensor_attributes
from torchscalpel.plan.options import PlanOptions
from torchscalpel.plan.simulate import OptimizerSpec
from torchscalpel.plan.spec import BatchSpec, TensorSpec
from torchscalpel.runtime.hooks import is_sequence_first
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
        """Backward calls before the first optimizer step outside it (micro-batches; see micro_batches)."""
        self.closure_evals = 0
        """Backward calls inside the first optimizer step (a closure: LBFGS evaluates it up to max_iter times)."""
        self._in_step = False
        self.optimizer: OptimizerSpec | None = None
        self.optimizer_stepped = False  # False with an optimizer: built over the model but never stepped
        self._trained = False  # a backward was seen: the forward and batch before it are the training ones
        self._root: nn.Module | None = None  # the root module as called (a DDP wrapper stays the wrapper)
        self._loader: Any = None
        self._seq_first: tuple[str, int] | None = (
            None  # (what said so, its batch size) in the training forward
        )

    def setup_hook(self) -> Any:
        """A runtime setup hook: global module forward *pre* hooks get no keyword arguments, so a
        global forward hook with ``with_kwargs`` reads them as the root call returns (transformers
        models are called as ``model(input_ids=x, labels=y)``). Returns the undo."""
        handle = nn.modules.module.register_module_forward_hook(self._forward_kwargs, with_kwargs=True)
        return handle.remove

    def _forward_kwargs(self, module: nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if module is self._root and not self._trained:
            self.kwargs = dict(kwargs)

    def on_start(self, session: Any) -> None:
        self.session = session

    def on_batch(self, batch: Any, loader: Any) -> None:
        if not self._trained:
            self.batch, self._loader = batch, loader

    def on_forward_pre(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], root: bool
    ) -> None:
        # The last root forward before the first backward is the training one: earlier calls may
        # be probes on a different batch (DDP's unused-parameter check, a sanity forward, eval).
        if self._trained:
            return
        if not root:
            self._note_sequence_first(module, args)
            return
        if not any(p.requires_grad for p in module.parameters()):
            return  # a loss module (nn.CrossEntropyLoss) or a frozen teacher: not the model being trained
        self._root, self._seq_first = module, None
        # Under DDP the root module is the wrapper; plan the model it holds (the strategy rows add
        # DDP's own buffers). Same inputs: DDP passes them through unchanged.
        if isinstance(module, DistributedDataParallel):
            module = module.module
        # Global pre hooks get no keyword arguments; the call's own frame has them. Read here, not only as
        # the call returns (setup_hook): a forward that runs out of memory under --memory-limit never returns,
        # and `scalpel memory`'s ladder plans exactly that call (transformers: model(input_ids=x, labels=y)).
        self.model, self.args, self.kwargs = module, args, dict(kwargs) or call_kwargs(self._root)
        device = next((p.device.type for p in module.parameters()), "cpu")
        if torch.is_autocast_enabled(device):
            self.autocast = torch.get_autocast_dtype(device)
        if torch.is_grad_enabled():
            # The optimizer is priced from its spec, taken now: a training forward that runs out of memory never
            # reaches a backward, and an optimizer local to the script's main() is gone (the session holds it
            # weakly) by the time the run ends. A stepping optimizer still replaces it.
            self._find_built_optimizer()

    def _note_sequence_first(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        """An RNN or attention layer with ``batch_first=False`` inside the training forward: its input
        is (sequence, batch, features), so dimension 1 is the batch."""
        if self.model is None or self._seq_first is not None or not is_sequence_first(module):
            return
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.dim() == 3:
            self._seq_first = (
                f"{type(module).__name__} with batch_first=False got input {list(x.shape)}",
                x.shape[1],
            )

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        self._in_step = True

    def on_backward_pre(self, tensors: tuple[torch.Tensor, ...]) -> None:
        if not self.optimizer_stepped:
            if self._in_step:
                self.closure_evals += 1  # a closure re-evaluating the same batch is not another micro-batch
            else:
                self.backwards += 1
            self._trained = self.model is not None
            self._find_built_optimizer()
            if self.backwards + self.closure_evals >= MAX_BACKWARDS_WITHOUT_STEP and self.session is not None:
                # Hand-written updates (no torch.optim): this many backward calls is enough to plan.
                self.session.request_stop("scalpel plan: no optimizer step after many backward calls")

    def on_optimizer_step_post(self, optimizer: torch.optim.Optimizer) -> None:
        self._in_step = False
        if self.optimizer_stepped:
            return
        self.optimizer, self.optimizer_stepped = optimizer_spec(optimizer), True
        if self.session is not None:
            self.session.request_stop("scalpel plan: first optimizer step seen")

    def on_finish(self, record: Any) -> None:
        if not self.optimizer_stepped:
            self._find_built_optimizer()

    def _find_built_optimizer(self) -> None:
        """An optimizer built over the model that has not stepped (yet): the one to price if none steps."""
        if self.optimizer is not None or self.model is None or self.session is None:
            return
        params = {id(p) for p in self.model.parameters()}
        for opt in list(getattr(self.session, "optimizers", ())):
            if any(id(p) in params for g in opt.param_groups for p in g["params"]):
                self.optimizer = optimizer_spec(opt)
                return

    # -- what the plan needs ---------------------------------------------------------------------
    def micro_batches(self) -> int:
        """Micro-batches of the first optimizer step, counted as the runtime counts them: backward calls before
        the step, plus one for a closure evaluated inside it (Lightning's last micro-batch, LBFGS's batch)."""
        if not self.optimizer_stepped:
            return 1
        return max(1, self.backwards + (1 if self.closure_evals else 0))

    def precision(self) -> str:
        """fp32 / bf16-mixed / fp16-mixed / bf16 / fp64, from autocast and the parameters' real dtype."""
        if self.autocast is torch.bfloat16:
            return "bf16-mixed"
        if self.autocast is torch.float16:
            return "fp16-mixed"
        assert self.model is not None
        dtypes = {p.dtype for p in self.model.parameters() if p.is_floating_point()}
        return {frozenset({torch.bfloat16}): "bf16", frozenset({torch.float64}): "fp64"}.get(
            frozenset(dtypes), "fp32"
        )

    def inputs(self) -> tuple[BatchSpec, Any, str]:
        """The batch as a spec (entries argN[_J] / keyword names / targetN, nested tensors included), a
        loss function that calls the model exactly as the script did, and which dimension is the batch."""
        arg_leaves = [tree_flatten(a) for a in self.args]
        kw_leaves = {k: tree_flatten(v) for k, v in self.kwargs.items()}
        inputs = [
            t
            for leaves, _ in [*arg_leaves, *kw_leaves.values()]
            for t in leaves
            if isinstance(t, torch.Tensor)
        ]
        given = {id(t) for t in inputs}
        loose = [t for t in _tensors(self.batch) if id(t) not in given]
        size, prefer, why = self._batch_size(inputs, loose)
        entries: list[TensorSpec] = []

        def add(name: str, value: Any) -> str | None:
            return _add(entries, name, value, _batch_dim(value, size, prefer))

        def slots(name: str, leaves: list[Any]) -> list[tuple[str | None, Any]]:
            if len(leaves) == 1:
                return [(add(name, leaves[0]), leaves[0])]
            return [(add(f"{name}_{j}", leaf), leaf) for j, leaf in enumerate(leaves)]

        positional = [(slots(f"arg{i}", leaves), spec) for i, (leaves, spec) in enumerate(arg_leaves)]
        keywords = {k: (slots(k, leaves), spec) for k, (leaves, spec) in kw_leaves.items()}
        targets = [
            n
            for n in (add(f"target{i}", t) for i, t in enumerate(_tensors(self.batch)) if id(t) not in given)
            if n
        ]

        def rebuild(parts: list[tuple[str | None, Any]], spec: Any, batch: dict[str, torch.Tensor]) -> Any:
            return tree_unflatten([batch[name] if name else value for name, value in parts], spec)

        def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            args = [rebuild(parts, spec, batch) for parts, spec in positional]
            kwargs = {k: rebuild(parts, spec, batch) for k, (parts, spec) in keywords.items()}
            return loss_from_output(model(*args, **kwargs), [batch[t] for t in targets])

        spec = BatchSpec(tuple(entries))
        dims = spec.batch_dims()
        return spec, loss_fn, f"batch dimension {dims} ({why})" if dims and why else ""

    def _batch_size(
        self, inputs: list[torch.Tensor], loose: list[torch.Tensor]
    ) -> tuple[int | None, int, str]:
        """(batch size, preferred dimension, why): the DataLoader's ``batch_size``; else what a
        sequence-first layer received; else dimension 0 of the loader's batch or of the first input."""
        prefer = 1 if self._seq_first else 0
        tensors = [t for t in [*inputs, *loose] if t.dim()]
        loader_size = getattr(self._loader, "batch_size", None)
        if isinstance(loader_size, int) and any(loader_size in t.shape for t in tensors):
            return loader_size, prefer, f"the DataLoader's batch_size {loader_size}"
        if self._seq_first is not None:
            what, size = self._seq_first
            return size, 1, f"sequence-first: {what}"
        from_loader = [t for t in _tensors(self.batch) if t.dim()]
        if from_loader:
            return from_loader[0].shape[0], 0, "dim 0 of the DataLoader's batch"
        if tensors:
            return tensors[0].shape[0], 0, "dim 0 of the model's first input"
        return None, 0, ""

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
            for _module, _name, tensors in plain_tensor_attributes(model):
                # A plain tensor attribute (a mask made in forward) is copied as its shape only: a real tensor
                # deep-copied under fake tensors cannot keep its CPU storage, and one with a graph cannot be copied.
                for t in tensors:
                    memo.setdefault(id(t), torch.empty_like(t, device="meta", requires_grad=False))
            try:
                return copy.deepcopy(model, memo)
            except Exception as exc:
                raise UsageError(
                    f"Cannot copy the script's model structure for planning ({type(exc).__name__}: {exc}); "
                    "use factory mode (--model MODULE:FACTORY)."
                ) from None

        return build


_CALL_IMPL = nn.Module._call_impl.__code__
CALL_FRAMES = 24
"""Frames walked up from a forward pre hook to the module call that ran it (hooks, session, observers)."""


def call_kwargs(module: nn.Module) -> dict[str, Any]:
    """The keyword arguments of the ``module(...)`` call now running its forward pre hooks ({} if not found).

    ``Module._call_impl(self, *args, **kwargs)`` holds them in its frame: the innermost such frame of
    ``module`` (a nested call of the same module is inside the outer one) is the call being hooked.
    """
    import sys

    f: Any = sys._getframe(1)
    for _ in range(CALL_FRAMES):
        if f is None:
            break
        if f.f_code is _CALL_IMPL and f.f_locals.get("self") is module:
            kwargs = f.f_locals.get("kwargs")
            return dict(kwargs) if isinstance(kwargs, dict) else {}
        f = f.f_back
    return {}


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        return [t for item in batch for t in _tensors(item)]
    return []


def _batch_dim(value: Any, size: int | None, prefer: int) -> int | None:
    """The dimension of ``value`` that is the batch: ``prefer`` if it has the batch size, else the first
    that has it; None (not scaled) when none has it."""
    if not isinstance(value, torch.Tensor) or size is None or not value.dim():
        return None
    shape = tuple(value.shape)
    if prefer < len(shape) and shape[prefer] == size:
        return prefer
    return next((d for d, n in enumerate(shape) if n == size), None)


def optimizer_spec(optimizer: torch.optim.Optimizer) -> OptimizerSpec:
    """The optimizer's class and first param group's hyperparameters (momentum, betas, ...)."""
    klass = type(optimizer)
    hyper = {
        k: (float(v) if isinstance(v, torch.Tensor) and v.numel() == 1 else v)
        for k, v in optimizer.param_groups[0].items()
        if k != "params"
    }
    hyper = {k: v for k, v in hyper.items() if not isinstance(v, torch.Tensor)}
    return OptimizerSpec(cls=f"{klass.__module__}.{klass.__qualname__}", kwargs=hyper)


def _add(entries: list[TensorSpec], name: str, value: Any, batch_dim: int | None = 0) -> str | None:
    """Append a spec for ``value`` if it is a tensor; the entry name, or None for non-tensors."""
    if not isinstance(value, torch.Tensor):
        return None
    high = None
    if not value.is_floating_point() and value.dtype != torch.bool and value.numel():
        high = int(value.max()) + 1  # token ids / class labels: keep embedding lookups in range
    entries.append(TensorSpec(name, value.dtype, tuple(value.shape), high, batch_dim))
    return name


def plan_script(
    args: PlanOptions,
    device: Any,
    strategies: list[str],
    *,
    progress: Callable[[int, int, str], None] | None = None,
) -> tuple[Any, Any]:
    """Run ``args.target`` to its first optimizer step, then plan what it used. Returns (plan, record)."""
    from torchscalpel.plan.planner import PlanRequest, make_plan
    from torchscalpel.plan.simulate import sim_settings_for
    from torchscalpel.runtime.fsdpwrap import FsdpCapture

    target = args.target
    if target is None:
        raise ValueError("plan_script needs options with a target (a script or a module)")
    observer = PlanObserver()
    fsdp = FsdpCapture()
    had_group = _process_group()
    # No step count: forward-only steps before the optimizer exists (a sanity forward) must not end
    # the run; the observer stops it at the first optimizer step.
    try:
        record = _run(target, observer, fsdp)
    finally:
        if not had_group and _process_group():
            # the script was stopped before its own cleanup: close the group it opened, so that this process
            # (a notebook, the next plan) can open one again
            import torch.distributed as dist

            dist.destroy_process_group()
    if observer.model is None:
        raise UsageError(
            f"The script never called a model (status {record.status}); plan needs one training step to see it."
        )
    if (
        not observer.optimizer_stepped
        and observer.backwards + observer.closure_evals == 0
        and record.status == "failed"
    ):
        raise UsageError(
            f"The script failed before its first optimizer step ({record.error}); fix it or use factory mode."
        )
    # --optimizer, when given, asks "what if"; otherwise the optimizer the script built, or none at all
    # (updates written by hand, ``p.data.add_(-lr * p.grad)``, keep no state).
    optimizer = (
        OptimizerSpec.named(args.optimizer or "none")
        if args.optimizer or observer.optimizer is None
        else observer.optimizer
    )
    batch, loss_fn, batch_note = observer.inputs()
    precision = observer.precision() if args.precision == "fp32" else args.precision
    accum = observer.micro_batches() if args.grad_accum == 1 else args.grad_accum
    wrap = fsdp.wraps[-1] if fsdp.wraps else None  # the root is wrapped last (its blocks first)
    if wrap is not None:
        # planned as the script shards (FSDP1 or FSDP2): the strategy its sharding names (unless --strategy asks
        # for another) and the parameter dtype of its mixed precision (unless autocast or --precision said one)
        if args.strategy == "all":
            strategies = [_wrap_strategy(wrap.strategy, args.world_size, args.nodes)]
        if precision == "fp32" and wrap.precision is not None:
            precision = wrap.precision
    request = PlanRequest(
        builder=observer.meta_builder(),
        batch=batch,
        loss_fn=loss_fn,
        strategies=strategies,
        world_size=args.world_size,
        nodes=args.nodes,
        device=device,
        checkpointing=args.checkpointing,
        search_max_batch=args.search_max_batch,
        model_name=type(observer.model).__name__,
        batch_note=batch_note,
        settings=sim_settings_for(optimizer, precision, accum, device),
        progress=progress,
        cpu_offload=wrap is not None and wrap.cpu_offload,
        replicated_bytes=wrap.ignored_bytes if wrap is not None else 0,
        fsdp=wrap.to_dict() if wrap is not None else None,
    )
    return make_plan(request), record


def _process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _run(target: Any, observer: PlanObserver, fsdp: Any) -> Any:
    """The script to its first optimizer step under the plan's observer and the FSDP capture."""
    from torchscalpel.runtime.session import RuntimeOptions, run_target

    return run_target(
        target,
        RuntimeOptions(
            warmup=0,
            steps=None,
            out_dir=None,
            profile_steps=0,
            name=f"plan-{target.name}",
            step_scalars=False,
        ),
        observers=[observer],
        setup_hooks=[observer.setup_hook, fsdp.setup_hook],
    )


def _wrap_strategy(strategy: str, world_size: int, nodes: int) -> str:
    """The script's FSDP strategy for this world: HYBRID_SHARD on one node shards over the node (fsdp-full)."""
    if strategy == "fsdp-hybrid" and (nodes < 2 or world_size // nodes < 2):
        return "fsdp-full"
    return strategy

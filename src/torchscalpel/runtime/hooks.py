"""PyTorch's global hooks, installed once per run and removed afterwards.

Why an importable module: dynamo traces through global hooks, and hooks defined in the
runner's ``__main__`` crash it (see TORCH-FACTS.md); each hook also returns at once while
compiling, so a compiled model sees 0 graph breaks from us.

Instrumented points:
- module forward pre/post hooks (root forward time, batch size, observers);
- ``Tensor.backward`` and ``torch.autograd.backward`` (backward time, the loss);
- optimizer step pre/post hooks (optimizer time, step boundaries) and ``Optimizer.__init__``
  (which optimizers exist, even before they step);
- ``GradScaler.scale`` (the scale, to report the true loss) and ``GradScaler.step`` (a step whose
  update was skipped on inf/NaN still ends the step);
- ``_BaseDataLoaderIter.__next__`` (data wait) and ``DataLoader.__iter__`` (which loaders).

Which root forwards are training forwards: one under grad mode, outside backward. A no-grad
forward once training is expected (an optimizer exists, or a forward already produced
gradients) is evaluation: it is neither a step nor forward time (it counts as ``other``). A
root-level forward inside backward is activation checkpointing's recomputation (backward time).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.amp import grad_scaler
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils.data import dataloader as dl_module

from torchscalpel.runtime.patching import wrap_attr

if TYPE_CHECKING:
    from torchscalpel.runtime.session import Session


def _compiling() -> bool:
    return torch.compiler.is_compiling()


class HookSet:
    """Installs the global hooks for one :class:`Session` and removes every one of them on :meth:`remove`."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._undo: list[Callable[[], None]] = []
        self._forward_depth = 0
        self._root_began = False
        self._root_role = "train"
        """What the open root forward is: ``train``, ``eval`` or ``recompute``."""
        self._eval_start: Any = None
        """The timeline's clock and its mark where the open evaluation forward began."""
        self._backward_depth = 0
        self._optimizer_posts = 0
        """Optimizer post-hooks seen: tells a GradScaler step whose update was skipped."""
        self._model_facts: weakref.WeakKeyDictionary[torch.nn.Module, tuple[bool, int]] = (
            weakref.WeakKeyDictionary()
        )
        self._global_forward: list[Any] = []
        self._root_handles: list[Any] = []
        self.tail = False
        """The run went on past its window (:meth:`enter_tail`): hooks only tick the tail's clock."""
        # The session's per-event observer lists, fixed for the run: read on every submodule call.
        self._pre_listeners = session.listeners["on_forward_pre"]
        self._post_listeners = session.listeners["on_forward_post"]

    # ----- install / remove ---------------------------------------------------------------
    def install(self) -> None:
        """Register every hook; safe to call once per session."""
        self._global_forward = [
            nn_module.register_module_forward_pre_hook(self._forward_pre),
            nn_module.register_module_forward_hook(self._forward_post, always_call=True),
        ]
        h3 = optim_module.register_optimizer_step_pre_hook(self._optimizer_pre)
        h4 = optim_module.register_optimizer_step_post_hook(self._optimizer_post)
        self._undo += [self._remove_forward_hooks, h3.remove, h4.remove]
        self._patch(torch.Tensor, "backward", self._wrap_backward)
        self._patch(torch.autograd, "backward", self._wrap_backward)
        self._patch(dl_module._BaseDataLoaderIter, "__next__", self._wrap_next)
        self._patch(dl_module.DataLoader, "__iter__", self._wrap_iter)
        self._patch(optim_module.Optimizer, "__init__", self._wrap_optimizer_init)
        self._patch(grad_scaler.GradScaler, "scale", self._wrap_scale)
        self._patch(grad_scaler.GradScaler, "step", self._wrap_scaler_step)

    def remove(self) -> None:
        """Undo every patch and hook, newest first."""
        while self._undo:
            self._undo.pop()()

    @property
    def evaluating(self) -> bool:
        """True while an evaluation forward runs (a root forward without grad once training is expected):
        what the FLOP count keeps apart from the step's FLOPs."""
        return self._forward_depth > 0 and self._root_role == "eval"

    def narrow_to_roots(self) -> bool:
        """Swap the global forward hooks for hooks on the root modules seen so far.

        Why: a global module hook sends every submodule call down ``Module._call_impl``'s slow
        path. Once the roots are known and no observer wants submodule events, hooks on the
        roots alone time the same forward calls at a fraction of the cost. A model first
        called later is then not seen (its time counts as ``other``), so the swap happens only
        after warm-up. Returns True if it swapped.
        """
        s = self.session
        if not self._global_forward or s.listeners["on_forward_pre"] or s.listeners["on_forward_post"]:
            return False
        roots = list(s.root_modules)
        if not roots or self._forward_depth:
            return False
        for h in self._global_forward:
            h.remove()
        self._global_forward = []
        for m in roots:
            self._root_handles.append(m.register_forward_pre_hook(self._forward_pre))
            self._root_handles.append(m.register_forward_hook(self._forward_post, always_call=True))
        return True

    def enter_tail(self) -> None:
        """The window is over and the run goes on under the set-up hooks' wrappers only (the doctor's
        cheap checks: saves, loads, exports): swap the forward hooks for a clock tick on the root modules,
        and let every other hook do nothing but tick (:meth:`Session.tail_tick`), so no step, span or
        observer event is recorded and the script runs at close to its own speed."""
        if self.tail:
            return
        self.tail = True
        root_ids = frozenset(id(m) for m in self.session.root_modules)
        self._remove_forward_hooks()
        tick = self.session.tail_tick

        def tail_pre(module: torch.nn.Module, _args: tuple[Any, ...]) -> None:
            if id(module) in root_ids:
                tick()

        # A global hook, not one on the root modules: a hook on a module travels with it into the script's
        # own torch.save(model) (a local function cannot be pickled: the save crashed) and copy.deepcopy.
        self._global_forward.append(nn_module.register_module_forward_pre_hook(tail_pre))

    def _remove_forward_hooks(self) -> None:
        for h in [*self._global_forward, *self._root_handles]:
            h.remove()
        self._global_forward, self._root_handles = [], []

    def _patch(
        self, owner: Any, name: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> None:
        self._undo.append(wrap_attr(owner, name, wrapper))

    # ----- forward ------------------------------------------------------------------------
    def _forward_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if _compiling():
            return
        s = self.session
        if self._forward_depth:
            # Inner module: the hot path (every submodule call), kept to a counter when no
            # observer listens to module events.
            self._forward_depth += 1
            if self._pre_listeners:
                s.emit("on_forward_pre", module, args, {}, False)
            return
        self._forward_depth = 1
        s.check_progress()
        tl = s.timeline
        if tl.inside("backward"):
            # Checkpoint recomputation: backward's time, not a new forward or a new root model.
            tl.begin("forward")
            self._root_role, self._root_began = "recompute", True
            tl.note_recompute()
            if self._pre_listeners:
                s.emit("on_forward_pre", module, args, {}, False)
            return
        s.note_root_module(module)
        if torch.is_grad_enabled() or not s.training_expected():
            self._root_role, self._root_began = "train", True
            tl.begin("forward")
            has_params, batch_dim = self._facts(module)
            if has_params:  # loss modules (no parameters) do not count samples
                samples = _batch_size(args, batch_dim)
                tl.note_forward(samples)
                if samples is None:
                    s.samples_unknown.setdefault(
                        "forward",
                        f"{type(module).__name__} was called without a positional tensor "
                        "(keyword arguments only, e.g. model(**batch)), so its inputs give no batch size",
                    )
        else:
            # Evaluation (estimate_loss, a validation loop) while training: not a step, not forward.
            self._root_role, self._root_began = "eval", False
            s.eval_forwards += 1
            self._eval_start = (tl.clock, tl.clock.mark())
        s.emit("on_forward_pre", module, args, {}, True)

    def _facts(self, module: torch.nn.Module) -> tuple[bool, int]:
        """Whether ``module`` has parameters, and its inputs' batch dimension (cached per model)."""
        facts = self._model_facts.get(module)
        if facts is None:
            facts = (next(module.parameters(), None) is not None, _batch_dim(module))
            self._model_facts[module] = facts
        return facts

    def _forward_post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if _compiling() or self._forward_depth == 0:
            return
        self._forward_depth -= 1
        s = self.session
        if self._forward_depth:
            if self._post_listeners:
                s.emit("on_forward_post", module, args, {}, output, False)
            return
        role, began = self._root_role, self._root_began
        self._root_began = False
        if role == "recompute":
            s.timeline.end("forward")
            if self._post_listeners:
                s.emit("on_forward_post", module, args, {}, output, False)
            return
        s.emit("on_forward_post", module, args, {}, output, True)
        if role == "eval":
            began, self._eval_start = self._eval_start, None
            if (
                began is not None and began[0] is s.timeline.clock
            ):  # a clock switched mid-forward: not measurable
                s.timeline.note_eval(began[1], s.timeline.clock.mark())
            return
        if not s.grad_forward_seen and _requires_grad(output):
            s.grad_forward_seen = True
        if began:
            s.timeline.end("forward")
        if s.timeline.in_phase is None:
            s.boundary("forward")

    # ----- backward -----------------------------------------------------------------------
    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if _compiling() or hooks._backward_depth:
                return original(*args, **kwargs)
            s = hooks.session
            if hooks.tail:
                s.tail_tick()
                return original(*args, **kwargs)
            tensors = _backward_tensors(args, kwargs)
            hooks._backward_depth += 1
            s.check_progress()
            s.emit("on_backward_pre", tensors)
            depth = s.timeline.depth
            outermost = s.timeline.begin("backward")
            try:
                return original(*args, **kwargs)
            finally:
                s.timeline.end_to(depth)  # backward's phase, and any a raise inside it left open
                hooks._backward_depth -= 1
                if tensors:
                    s.timeline.note_loss(s.loss_of(tensors[0]))
                s.emit("on_backward_post", tensors)
                if outermost:
                    s.boundary("backward")

        return backward

    # ----- optimizer ----------------------------------------------------------------------
    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if _compiling() or self.tail:
            return
        self.session.note_optimizer(optimizer)
        self.session.emit("on_optimizer_step_pre", optimizer)
        self.session.timeline.begin("optimizer")

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if _compiling():
            return
        if self.tail:
            self.session.tail_tick()
            return
        s = self.session
        self._optimizer_posts += 1
        s.timeline.end("optimizer")
        s.emit("on_optimizer_step_post", optimizer)
        if s.timeline.in_phase is None:
            s.boundary("optimizer", id(optimizer))

    def _wrap_optimizer_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        @functools.wraps(original)
        def __init__(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original(opt, *args, **kwargs)
            hooks.session.note_optimizer(opt)

        return __init__

    def _wrap_scale(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        @functools.wraps(original)
        def scale(scaler: Any, outputs: Any) -> Any:
            out = original(scaler, outputs)
            factor = getattr(scaler, "_scale", None)
            if not hooks.tail and isinstance(out, torch.Tensor) and isinstance(factor, torch.Tensor):
                # A copy, since update() changes the scale in place; no sync (device-side clone).
                hooks.session.scaled_losses[id(out)] = factor.detach().clone()
            return out

        return scale

    def _wrap_scaler_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        @functools.wraps(original)
        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = hooks._optimizer_posts
            out = original(scaler, optimizer, *args, **kwargs)
            s = hooks.session
            if (
                hooks._optimizer_posts == before
                and not hooks.tail
                and isinstance(optimizer, torch.optim.Optimizer)
                and not _compiling()
            ):
                # inf/NaN gradients: GradScaler skipped optimizer.step(), so no hook fired; the
                # iteration still ends here, as a step with no update.
                s.note_optimizer(optimizer)
                s.timeline.note_skipped_update()
                if s.timeline.in_phase is None:
                    s.boundary("optimizer", id(optimizer))
            return out

        return step

    # ----- data ---------------------------------------------------------------------------
    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        @functools.wraps(original)
        def __next__(it: Any) -> Any:
            s = hooks.session
            if hooks.tail:
                s.tail_tick()
                return original(it)
            s.timeline.begin("data")
            try:
                batch = original(it)
            finally:
                s.timeline.end("data")
            if torch.is_grad_enabled():  # an evaluation loop's batches are not training samples
                samples = _batch_size((batch,))
                s.timeline.note_batch(samples)
                if samples is None:
                    s.samples_unknown.setdefault(
                        "batch",
                        f"the training DataLoader's batches ({type(batch).__name__}) hold no tensor "
                        "(nor a list, tuple or mapping of tensors) to read a batch size from",
                    )
            ref = getattr(it, "_scalpel_loader", None)
            s.emit("on_batch", batch, ref() if ref is not None else None)
            return batch

        return __next__

    def _wrap_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        @functools.wraps(original)
        def __iter__(loader: Any) -> Any:
            it = original(loader)
            try:
                it._scalpel_loader = weakref.ref(loader)
            except (AttributeError, TypeError):
                pass
            hooks.session.note_loader(loader)
            return it

        return __iter__


def _batch_size(args: tuple[Any, ...], batch_dim: int = 0) -> int | None:
    """Size of the first tensor argument along ``batch_dim`` (None when there is none).

    A 1-D input of a sequence-first model is one unbatched sequence: its batch is 1. A mapping counts
    as a dict: Hugging Face's ``BatchEncoding`` (what a tokenizer's collate returns, and what an
    accelerate-prepared loader yields) is a ``UserDict``, not a ``dict``.
    """
    for a in args:
        tensor = a if isinstance(a, torch.Tensor) else None
        if tensor is None and isinstance(a, Mapping | list | tuple):
            values = a.values() if isinstance(a, Mapping) else a
            tensor = next((v for v in values if isinstance(v, torch.Tensor) and v.dim() > 0), None)
        if tensor is not None and tensor.dim() > 0:
            if tensor.dim() > batch_dim:
                return int(tensor.shape[batch_dim])
            return 1
    return None


_SEQUENCE_FIRST_TYPES: tuple[type[torch.nn.Module], ...] = (
    torch.nn.RNNBase,
    torch.nn.MultiheadAttention,
    torch.nn.Transformer,
    torch.nn.TransformerEncoderLayer,
    torch.nn.TransformerDecoderLayer,
)


def is_sequence_first(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a torch layer that takes (sequence, batch, ...) input: an RNN, attention or
    Transformer layer built without ``batch_first=True``. The one definition the runtime's batch
    counting and the planner's input reading share."""
    if not isinstance(module, _SEQUENCE_FIRST_TYPES):
        return False
    first = getattr(module, "batch_first", None)
    if first is None:  # TransformerEncoderLayer keeps it on its attention block
        first = getattr(getattr(module, "self_attn", None), "batch_first", True)
    return not first


def _batch_dim(model: torch.nn.Module) -> int:
    """1 for a model built on sequence-first layers (an LSTM or Transformer without batch_first), else 0.

    Why: word_language_model-style scripts feed (seq, batch) tensors; dim 0 there is the sequence.
    The first RNN or Transformer layer decides. A bare ``MultiheadAttention`` does not: models
    usually transpose into it, so its layout says nothing about the model's input.
    """
    for sub in model.modules():
        if isinstance(sub, _SEQUENCE_FIRST_TYPES) and not isinstance(sub, torch.nn.MultiheadAttention):
            return 1 if is_sequence_first(sub) else 0
    return 0


def _backward_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """The tensors backward runs from: ``self`` for Tensor.backward, ``tensors`` for autograd.backward."""
    first = args[0] if args else kwargs.get("tensors")
    if isinstance(first, torch.Tensor):
        return (first,)
    if isinstance(first, list | tuple):
        return tuple(t for t in first if isinstance(t, torch.Tensor))
    return ()


def _requires_grad(output: Any) -> bool:
    """True if any tensor in a (nested) forward output requires grad."""
    if isinstance(output, torch.Tensor):
        return output.requires_grad
    if isinstance(output, list | tuple):
        return any(_requires_grad(o) for o in output[:8])
    if isinstance(output, dict):
        return any(_requires_grad(o) for o in list(output.values())[:8])
    return any(_requires_grad(v) for v in list(getattr(output, "__dict__", {}).values())[:8])

"""PyTorch's global hooks, installed once per run and removed afterwards.

Why an importable module: dynamo traces through global hooks, and hooks defined in the
runner's ``__main__`` crash it (see TORCH-FACTS.md); each hook also returns at once while
compiling, so a compiled model sees 0 graph breaks from us.

Instrumented points:
- module forward pre/post hooks (root forward time, batch size, observers);
- ``Tensor.backward`` and ``torch.autograd.backward`` (backward time, the loss);
- optimizer step pre/post hooks (optimizer time, step boundaries) and ``Optimizer.__init__``
  (which optimizers exist, even before they step);
- ``_BaseDataLoaderIter.__next__`` (data wait) and ``DataLoader.__iter__`` (which loaders).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.amp import grad_scaler
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils.data import dataloader as dl_module

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
        self._root_timed = False
        self._backward_depth = 0
        self._global_forward: list[Any] = []
        self._root_handles: list[Any] = []
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

    def remove(self) -> None:
        """Undo every patch and hook, newest first."""
        while self._undo:
            self._undo.pop()()

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

    def _remove_forward_hooks(self) -> None:
        for h in [*self._global_forward, *self._root_handles]:
            h.remove()
        self._global_forward, self._root_handles = [], []

    def _patch(self, owner: Any, name: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, wrapper(original))
        self._undo.append(lambda: setattr(owner, name, original))

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
        s.note_root_module(module)
        # A no-grad forward during training is evaluation: it counts as "other", not forward.
        self._root_timed = False
        if torch.is_grad_enabled() or s.timeline.kind == "forward":
            self._root_timed = s.timeline.begin("forward")
            s.timeline.note_forward(_batch_size(args))
        s.emit("on_forward_pre", module, args, {}, True)

    def _forward_post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if _compiling() or self._forward_depth == 0:
            return
        self._forward_depth -= 1
        s = self.session
        if self._forward_depth:
            if self._post_listeners:
                s.emit("on_forward_post", module, args, {}, output, False)
            return
        s.emit("on_forward_post", module, args, {}, output, True)
        if not s.grad_forward_seen and _requires_grad(output):
            s.grad_forward_seen = True
        if self._root_timed:
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
            tensors = _backward_tensors(args, kwargs)
            hooks._backward_depth += 1
            s.emit("on_backward_pre", tensors)
            timed = s.timeline.begin("backward")
            try:
                return original(*args, **kwargs)
            finally:
                s.timeline.end("backward")
                hooks._backward_depth -= 1
                if tensors:
                    s.timeline.note_loss(s.loss_of(tensors[0]))
                s.emit("on_backward_post", tensors)
                if timed and s.timeline.in_phase is None:
                    s.boundary("backward")

        return backward

    # ----- optimizer ----------------------------------------------------------------------
    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if _compiling():
            return
        self.session.note_optimizer(optimizer)
        self.session.emit("on_optimizer_step_pre", optimizer)
        self.session.timeline.begin("optimizer")

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if _compiling():
            return
        s = self.session
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
            if isinstance(out, torch.Tensor) and isinstance(factor, torch.Tensor):
                # A copy, since update() changes the scale in place; no sync (device-side clone).
                hooks.session.scaled_losses[id(out)] = factor.detach().clone()
            return out

        return scale

    # ----- data ---------------------------------------------------------------------------
    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        @functools.wraps(original)
        def __next__(it: Any) -> Any:
            s = hooks.session
            s.timeline.begin("data")
            try:
                batch = original(it)
            finally:
                s.timeline.end("data")
            s.timeline.note_batch(_batch_size((batch,)))
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


def _batch_size(args: tuple[Any, ...]) -> int | None:
    """Leading dimension of the first tensor argument (None when there is none)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() > 0:
            return int(a.shape[0])
        if isinstance(a, dict):
            for v in a.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    return int(v.shape[0])
    return None


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

"""A GradScaler inserted into an unmodified script, for fp16 autocast (CUDA GPUs without bf16).

fp16 has a narrow exponent range: small gradients underflow to zero unless the loss is scaled up
before backward and the gradients scaled back down before anything reads them. The script was
written for float32, so the runtime does the GradScaler recipe for it:

- ``loss.backward()`` runs on ``scaler.scale(loss)`` (a scalar loss; ``torch.autograd.backward``
  calls are left as they are);
- ``clip_grad_norm_`` / ``clip_grad_value_`` first unscale the gradients of every optimizer that
  holds the clipped parameters (once per step), so clipping sees the true norm;
- ``optimizer.step()`` becomes ``scaler.step(optimizer)`` (which unscales if not yet done and
  *skips the step* when a gradient is inf/NaN), followed by ``scaler.update()``.

A script that already uses a GradScaler is left alone (its own ``scaler.scale`` call is seen and
ours steps aside for the rest of the run).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from torchscalpel.runtime.patching import undo_all, wrap_attr
from torchscalpel.tune.knobs.base import ApplyLog, Undo


class InsertedScaler:
    """The GradScaler state for one run, and the patches that apply it."""

    def __init__(self, device: str, log: ApplyLog) -> None:
        self.scaler = torch.amp.GradScaler(device)
        self.log = log
        self.optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.unscaled: set[int] = set()
        self.in_scaler_step = False
        self.script_has_scaler = False
        self.skipped_steps = 0

    # -- backward ---------------------------------------------------------------------------------
    def wrap_backward(self, original: Any) -> Any:
        scaler = self

        @functools.wraps(original)
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if scaler.script_has_scaler or torch.compiler.is_compiling() or tensor.numel() != 1:
                return original(tensor, *args, **kwargs)
            scaler.log.did("amp", "loss scaled by an inserted GradScaler before backward")
            return original(scaler.scaler.scale(tensor), *args, **kwargs)

        return backward

    # -- clipping ---------------------------------------------------------------------------------
    def wrap_clip(self, original: Any) -> Any:
        scaler = self

        @functools.wraps(original)
        def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if not scaler.script_has_scaler:
                params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                ids = {id(p) for p in params}
                for opt in list(scaler.optimizers):
                    owns = any(id(p) in ids for g in opt.param_groups for p in g["params"])
                    if owns and id(opt) not in scaler.unscaled:
                        scaler.scaler.unscale_(opt)
                        scaler.unscaled.add(id(opt))
                        scaler.log.did("amp", "gradients unscaled before clipping")
                parameters = params
            return original(parameters, *args, **kwargs)

        return clip

    # -- the step ---------------------------------------------------------------------------------
    def wrap_init(self, original: Any) -> Any:
        scaler = self

        @functools.wraps(original)
        def init(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original(opt, *args, **kwargs)
            if type(opt).__name__ == "LBFGS":  # closures re-evaluate the loss: no scaler recipe
                return
            scaler.optimizers.add(opt)
            step = opt.step  # the bound (profile-wrapped) step torch.optim set up

            @functools.wraps(step)
            def scaled_step(*a: Any, **k: Any) -> Any:
                if scaler.script_has_scaler or scaler.in_scaler_step:
                    return step(*a, **k)
                scaler.in_scaler_step = True
                try:
                    before = scaler.scaler.get_scale()
                    # GradScaler.step calls opt.step again: in_scaler_step sends that call through.
                    out = scaler.scaler.step(opt, *a, **k)
                    scaler.scaler.update()
                    if scaler.scaler.get_scale() < before:
                        scaler.skipped_steps += 1
                        scaler.log.did(
                            "amp", "a step with inf/NaN gradients was skipped and the scale lowered"
                        )
                    else:
                        scaler.log.did("amp", "optimizer.step through the inserted GradScaler")
                    return out
                finally:
                    scaler.in_scaler_step = False
                    scaler.unscaled.discard(id(opt))

            opt.step = scaled_step  # type: ignore[method-assign]

        return init

    def wrap_script_scale(self, original: Any) -> Any:
        """The script's own GradScaler: ours steps aside."""
        scaler = self

        @functools.wraps(original)
        def scale(gs: Any, *args: Any, **kwargs: Any) -> Any:
            if gs is not scaler.scaler and not scaler.script_has_scaler:
                scaler.script_has_scaler = True
                scaler.log.skip("amp", "the script has its own GradScaler; the inserted one steps aside")
            return original(gs, *args, **kwargs)

        return scale


def install_grad_scaler(device: str, log: ApplyLog) -> Undo:
    """Patch backward, clipping, optimizer construction and GradScaler.scale; return the undo."""
    from torch.amp import grad_scaler
    from torch.nn.utils import clip_grad

    state = InsertedScaler(device, log)
    patches: list[tuple[Any, str, Any]] = [
        (torch.Tensor, "backward", state.wrap_backward),
        (torch.nn.utils, "clip_grad_norm_", state.wrap_clip),
        (torch.nn.utils, "clip_grad_value_", state.wrap_clip),
        (clip_grad, "clip_grad_norm_", state.wrap_clip),
        (clip_grad, "clip_grad_value_", state.wrap_clip),
        (torch.optim.Optimizer, "__init__", state.wrap_init),
        (grad_scaler.GradScaler, "scale", state.wrap_script_scale),
    ]
    return undo_all([wrap_attr(owner, name, wrap) for owner, name, wrap in patches])

"""How factory mode feeds a batch to the model and gets a loss.

Calling convention (documented in docs/plan.md):

- batch entries whose names match parameters of ``model.forward`` are passed as keyword arguments;
  if no entry matches, the first entry is passed positionally; the rest are targets;
- with ``--loss MODULE:FN`` the loss is ``FN(model, batch)`` (batch: dict name -> tensor);
- otherwise the loss is read from the output: a ``.loss`` attribute or ``"loss"`` key (transformers
  models given ``labels``), a scalar output, cross-entropy against an integer target, MSE against a
  float target, or the mean of the output when there is no target.

Which modules are "blocks" (FSDP units, checkpointed regions, compile regions) is decided in one
place for every stage: :func:`torchscalpel.blocks.find_blocks`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]

_MODULE_TABLES = frozenset({"_parameters", "_buffers", "_modules"})


def plain_tensor_attributes(model: nn.Module) -> list[tuple[nn.Module, str, list[torch.Tensor]]]:
    """Tensors a model holds as plain attributes, neither parameters nor buffers: ``(module, attribute,
    tensors)`` for each attribute holding one directly or inside a list / tuple / dict.

    Lightning's demo Transformer keeps ``self.src_mask = torch.triu(...)`` and a positional table this
    way (``.to()`` and ``state_dict`` skip them); planning must still copy them to meta and fake
    tensors with the rest of the model, or its forward mixes devices.
    """
    from torch.utils._pytree import tree_flatten

    found = []
    for module in model.modules():
        for name, value in vars(module).items():
            if name in _MODULE_TABLES:
                continue
            tensors = [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
            if tensors:
                found.append((module, name, tensors))
    return found


def split_batch(
    model: nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], list[torch.Tensor]]:
    """(positional inputs, keyword inputs, targets) following the calling convention above."""
    inner = model
    # DDP (``.module``) and torch.compile (``._orig_mod``) wrap forward as (*inputs, **kwargs)
    while isinstance(
        wrapped := getattr(inner, "module", None) or getattr(inner, "_orig_mod", None), nn.Module
    ):
        inner = wrapped
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        params = {}
    accepts_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {k: v for k, v in batch.items() if k in params}
    if named:
        targets = [v for k, v in batch.items() if k not in named]
        return [], named, targets
    items = list(batch.values())
    if accepts_var_kw and not params.keys() - {"kwargs"}:
        return [], dict(batch), []
    return items[:1], {}, items[1:]


def default_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[Any, torch.Tensor]:
    """Run the model on ``batch`` and derive a scalar loss; returns (output, loss)."""
    args, kwargs, targets = split_batch(model, batch)
    out = model(*args, **kwargs)
    return out, loss_from_output(out, targets)


def loss_from_output(out: Any, targets: list[torch.Tensor]) -> torch.Tensor:
    """The scalar the step calls backward on, read from a model output (see module docstring)."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    tensor = _first_tensor(out)
    if tensor is None:
        raise ValueError("the model output holds no tensor to compute a loss from; pass --loss MODULE:FN")
    if tensor.dim() == 0:
        return tensor
    target = targets[0] if targets else None
    if target is not None and not target.dtype.is_floating_point and tensor.dtype.is_floating_point:
        if tensor.dim() >= 2 and tensor.shape[:-1] == target.shape:
            return F.cross_entropy(tensor.reshape(-1, tensor.shape[-1]), target.reshape(-1))
        if tensor.dim() >= 2 and tensor.shape[0] == target.shape[0] and tensor.dim() == target.dim() + 1:
            return F.cross_entropy(tensor, target)
    if target is not None and target.dtype.is_floating_point and target.shape == tensor.shape:
        return F.mse_loss(tensor, target)
    return tensor.float().mean()


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, list | tuple):
        for item in out:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def unique_params(module: nn.Module) -> list[nn.Parameter]:
    """Parameters of ``module`` without duplicates (tied weights count once)."""
    seen: set[int] = set()
    out = []
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


_CACHE_KWARGS = ("cache", "layer_past", "past_key_value", "past_key_values")
"""Names transformers' layers give their key/value cache argument."""


def is_kv_cache(value: Any) -> bool:
    """A transformers ``Cache`` (``DynamicCache``, ...), recognised by its class, without importing transformers."""
    return any(c.__name__ == "Cache" and c.__module__.startswith("transformers") for c in type(value).__mro__)


def without_kv_cache(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A checkpointed block's call arguments with its key/value cache dropped (``use_cache=False``, cache None).

    Why: a checkpoint's recompute in backward runs the block again with the same arguments, and a layer that
    writes to a transformers cache would append its keys a second time (GPT-2's attention then sees twice
    the keys and fails: "Attempting to broadcast a dimension of length 256"). A training forward with grad
    never reads the cache it writes, so transformers itself drops it under gradient checkpointing
    (``GradientCheckpointingLayer``); the same is done here, for the cache passed by keyword or position.
    """
    if not any(is_kv_cache(a) for a in args) and not any(
        (k in _CACHE_KWARGS and v is not None) or (k == "use_cache" and v) for k, v in kwargs.items()
    ):
        return args, kwargs
    args = tuple(None if is_kv_cache(a) else a for a in args)
    kwargs = {
        k: (None if k in _CACHE_KWARGS else False if k == "use_cache" else v) for k, v in kwargs.items()
    }
    return args, kwargs

"""Module names a user recognises in memory reports: an index names no layer, so its class is added.

The qualified name ``layers.3`` says nothing about what layer 3 is; ``layers.3 (Linear)`` does. Used by
the allocation tracker (activation owners, the module at the peak and at an out-of-memory), the per-block
rollup and the micro-batch knob's BatchNorm refusal, so every report names a module the same way.
"""

from __future__ import annotations

import torch


def display_name(qualified: str, module: torch.nn.Module, root: str) -> str:
    """``layers.3`` -> ``layers.3 (Linear)``: an index names no layer, so its class is added.

    A child of an ``nn.Sequential`` / ``nn.ModuleList`` root (qualified name ``3``) also gets the root's
    class as its parent path (``Sequential.3 (Linear)``). Named children (``blocks.0.attn``) are unchanged;
    :func:`split_display_name` gives the qualified name back.
    """
    last = qualified.rsplit(".", 1)[-1]
    if not last.isdigit():
        return qualified
    path = qualified if "." in qualified else f"{root}.{qualified}"
    return f"{path} ({type(module).__name__})"


WRAPPER_ATTRIBUTES = frozenset(
    {"_forward_module", "_original_module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
)
"""Attributes under which a wrapper holds the user's model: Fabric / Lightning's ``_FabricModule``
(``_forward_module``, and ``_original_module`` when a strategy wrapped it in between), torch.compile's
``OptimizedModule`` (``_orig_mod``), FSDP1 (``_fsdp_wrapped_module``), ``checkpoint_wrapper``. Private names
no model uses for a layer of its own, so they are dropped wherever they appear."""

DATA_PARALLEL = ("DistributedDataParallel", "DataParallel")
"""Wrapper classes holding the model as ``.module``: that segment is dropped only under one of these, since
``module`` is also a name a model may give its own layer."""


def _is_wrapper_segment(parent: torch.nn.Module, segment: str) -> bool:
    if segment in WRAPPER_ATTRIBUTES:
        return True
    return segment == "module" and any(k.__name__ in DATA_PARALLEL for k in type(parent).__mro__)


def user_path(root: torch.nn.Module, qualified: str) -> str:
    """``_forward_module.module._orig_mod.blocks.0`` -> ``blocks.0``: the name without wrapper segments."""
    kept: list[str] = []
    node: torch.nn.Module | None = root
    for segment in qualified.split(".") if qualified else []:
        child = node._modules.get(segment) if node is not None else None
        if node is None or not _is_wrapper_segment(node, segment):
            kept.append(segment)
        node = child
    return ".".join(kept)


def user_modules(root: torch.nn.Module) -> tuple[str, list[tuple[str, torch.nn.Module]]]:
    """(the wrapped model's class name, ``(display name, module)`` for every submodule of ``root``).

    Names are :func:`user_path` (wrappers dropped, so memory output under Fabric, DDP or torch.compile names
    ``blocks.0.attn`` as in the user's code) through :func:`display_name`; a wrapper and the module it wraps
    share a name and are both named by the inner module's class. The root and every wrapper around the model
    get the model's class name.
    """
    named = [(user_path(root, q), m) for q, m in root.named_modules()]
    inner = {path: m for path, m in named}  # pre-order: the last module on a path is the innermost
    root_name = type(inner.get("", root)).__name__
    return root_name, [
        (display_name(path, inner[path], root_name) if path else root_name, m) for path, m in named
    ]


def split_display_name(name: str) -> tuple[str, str | None]:
    """``blocks.3 (Block)`` -> (``blocks.3``, ``Block``); a name without a class -> (name, None)."""
    if name.endswith(")") and " (" in name:
        path, cls = name[:-1].rsplit(" (", 1)
        return path, cls
    return name, None

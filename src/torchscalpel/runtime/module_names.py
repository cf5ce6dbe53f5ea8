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


def split_display_name(name: str) -> tuple[str, str | None]:
    """``blocks.3 (Block)`` -> (``blocks.3``, ``Block``); a name without a class -> (name, None)."""
    if name.endswith(")") and " (" in name:
        path, cls = name[:-1].rsplit(" (", 1)
        return path, cls
    return name, None

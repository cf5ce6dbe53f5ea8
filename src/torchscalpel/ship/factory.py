"""Build the user's model from ``--model MODULE:FACTORY`` and ``--factory-args JSON``.

``MODULE:FACTORY`` is loaded by :func:`torchscalpel.loading.load_callable` (a dotted module or a
``.py`` path); ``FACTORY`` is any callable returning an ``nn.Module`` (a function or the class).
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import torch

from torchscalpel.errors import UsageError
from torchscalpel.loading import load_callable


def parse_factory_args(text: str | None) -> tuple[list[Any], dict[str, Any]]:
    """``--factory-args`` as positional and keyword arguments (a JSON object or array)."""
    if not text:
        return [], {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--factory-args is not valid JSON ({exc.msg}); write e.g. '{{\"hidden\": 64}}'."
        ) from None
    if isinstance(value, dict):
        return [], value
    if isinstance(value, list):
        return value, {}
    raise UsageError(
        "--factory-args must be a JSON object (keyword arguments) or array (positional arguments)."
    )


def build_model(spec: str, factory_args: str | None = None) -> torch.nn.Module:
    """Call the factory with the arguments and check it returned an ``nn.Module`` (in eval mode)."""
    factory = load_callable(spec, flag="--model")
    args, kwargs = parse_factory_args(factory_args)
    try:
        model = factory(*args, **kwargs)
    except TypeError as exc:
        raise UsageError(f"Calling {spec} with --factory-args failed: {exc}.") from None
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module.")
    return model.eval()


def forward_input_names(model: torch.nn.Module, count: int) -> list[str]:
    """The first ``count`` parameter names of ``model.forward`` (the ONNX and manifest input names)."""
    try:
        params = [
            p.name
            for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    names = params[:count]
    names += [f"input_{i}" for i in range(len(names), count)]
    return names

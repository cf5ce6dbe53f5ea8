"""Build the user's model from ``--model MODULE:FACTORY`` and ``--factory-args JSON``.

``MODULE`` is a dotted module name importable from the current folder, or a path to a ``.py``
file. ``FACTORY`` is any callable returning an ``nn.Module`` (a function or the module class).
Importing it runs the user's own code, which is what they asked for; nothing else is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import torch

from torchscalpel.errors import UsageError


def parse_factory_args(text: str | None) -> tuple[list[Any], dict[str, Any]]:
    """``--factory-args`` as positional and keyword arguments (a JSON object or array)."""
    if not text:
        return [], {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--factory-args is not valid JSON ({exc.msg}); write e.g. '{{\"hidden\": 64}}'.") from None
    if isinstance(value, dict):
        return [], value
    if isinstance(value, list):
        return value, {}
    raise UsageError("--factory-args must be a JSON object (keyword arguments) or array (positional arguments).")


def load_factory(spec: str) -> Any:
    """Resolve ``MODULE:FACTORY`` to the callable (raises :class:`UsageError` naming what is wrong)."""
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise UsageError(f"--model {spec!r} must look like 'package.module:make_model' or 'path/model.py:Net'.")
    if module_part.endswith(".py"):
        path = Path(module_part)
        if not path.is_file():
            raise UsageError(f"--model file {path} does not exist; check the path.")
        name = f"_scalpel_model_{abs(hash(str(path.resolve())))}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        # The file may import its siblings, as it would when run as a script.
        sys.path.insert(0, str(path.resolve().parent))
        mod_spec.loader.exec_module(module)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as exc:
            raise UsageError(
                f"Cannot import {module_part!r} for --model ({exc}); run from the folder that holds it or give a .py path."
            ) from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise UsageError(f"{module_part} has no callable {attr!r}; name the function or class that builds the model.")
    return factory


def build_model(spec: str, factory_args: str | None = None) -> torch.nn.Module:
    """Call the factory with the arguments and check it returned an ``nn.Module`` (in eval mode)."""
    factory = load_factory(spec)
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

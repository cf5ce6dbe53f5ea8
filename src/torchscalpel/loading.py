"""Load the user's callable from ``MODULE:NAME`` (``plan --model/--loss``, ``export --model``).

``MODULE`` is a path to a ``.py`` file (anything ending in ``.py``, holding a ``/`` or starting
with ``.``) or a dotted module name importable from the current folder. A file's own folder goes
on ``sys.path`` first, so it imports its siblings as it would when run as a script. Importing runs
the user's own code, which is what they asked for; nothing else is imported.

Every failure is one :class:`UsageError` sentence that starts with the flag: a malformed
reference, a file that does not exist, an import that failed (with the exception's first line),
a missing attribute, an attribute that is not callable.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from torchscalpel.errors import UsageError


def load_callable(ref: str, *, flag: str) -> Callable[..., Any]:
    """Import ``MODULE:NAME`` and return ``NAME``; ``flag`` (e.g. ``--model``) starts every error sentence."""
    module_ref, sep, name = (ref or "").rpartition(":")
    if not sep or not module_ref or not name:
        raise UsageError(
            f"{flag} {ref!r} must be MODULE:NAME, e.g. 'mypkg.models:build' or 'path/models.py:build'."
        )
    if _is_path(module_ref):
        path = Path(module_ref)
        if not path.is_file():
            raise UsageError(f"{flag}: file {path} does not exist; check the path before ':{name}'.")
    try:
        module = _import_file(Path(module_ref)) if _is_path(module_ref) else _import_dotted(module_ref)
    except Exception as exc:
        raise UsageError(
            f"{flag}: cannot import {module_ref!r} ({_one_line(exc)}); check the module name and that it imports "
            "on its own, or give a .py path."
        ) from None
    if not hasattr(module, name):
        raise UsageError(
            f"{flag}: {module_ref!r} has no attribute {name!r}; name a function or class defined there."
        )
    target = getattr(module, name)
    if not callable(target):
        raise UsageError(
            f"{flag}: {module_ref}:{name} is a {type(target).__name__}, not callable; name a function or class."
        )
    return target


def _is_path(module_ref: str) -> bool:
    return module_ref.endswith(".py") or "/" in module_ref or module_ref.startswith(".")


def _import_file(path: Path) -> ModuleType:
    """Execute ``path`` as a fresh module (a unique name per file, so two ``model.py`` never collide)."""
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode(), usedforsecurity=False).hexdigest()[:10]
    mod_name = f"_scalpel_user_{resolved.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(mod_name, resolved)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not loadable as Python source")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    folder = str(resolved.parent)
    if not sys.path or sys.path[0] != folder:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def _import_dotted(module_ref: str) -> ModuleType:
    """``importlib.import_module`` with the current folder importable (as ``python -m`` would have it)."""
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return importlib.import_module(module_ref)


def _one_line(exc: BaseException) -> str:
    """``'TypeName: first line of the message'`` (just the type name when the message is empty)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__

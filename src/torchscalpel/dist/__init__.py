"""Deprecated name of :mod:`torchscalpel.distributed`, kept importable for one release.

``dist`` is the folder name every packaging tool treats as build output, so the package moved.
``import torchscalpel.dist`` and ``from torchscalpel.dist.wrap import wrap`` still work, with a
``DeprecationWarning``; both give the very same module objects as the new name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

_OLD, _NEW = "torchscalpel.dist", "torchscalpel.distributed"

warnings.warn("torchscalpel.dist is renamed torchscalpel.distributed; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)


class _AliasLoader(importlib.abc.Loader):
    """Loads ``torchscalpel.dist.X`` as the already-importable ``torchscalpel.distributed.X``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed under its new name."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Maps every ``torchscalpel.dist.*`` import onto ``torchscalpel.distributed.*``."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_OLD + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(_NEW + fullname[len(_OLD):]))


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())

_new = importlib.import_module(_NEW)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
__all__ = list(getattr(_new, "__all__", []))

"""Memory analysis: where memory goes (category, module, call site), what grows, and why a run ran out.

``scalpel memory`` (docs/memory.md) runs a script under :class:`~torchscalpel.memory.observer.MemoryObserver`;
``torchscalpel.memory(...)`` opens the same accounting around a block of the user's own code
(:func:`torchscalpel.inprocess.memory`). The package is callable for the reason the doctor package
is (see ``torchscalpel.doctor``): once a submodule is imported, Python binds the package to the name
``torchscalpel.memory``, so a plain function of that name would be shadowed.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torchscalpel.inprocess import memory

        return memory(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

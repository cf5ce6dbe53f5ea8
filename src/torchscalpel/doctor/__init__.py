"""The doctor: static and runtime rules that find training-script pitfalls (see docs/doctor.md).

The package is also the in-process API's entry point: ``torchscalpel.doctor(steps=..., out=...)``
opens a diagnosed block (:func:`torchscalpel.inprocess.doctor`). Why a callable module: once any
``torchscalpel.doctor.*`` submodule is imported, Python binds the package itself to the name
``torchscalpel.doctor``, so a plain function of that name would be shadowed depending on import
order; making the package callable gives users the same object either way.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torchscalpel.inprocess import doctor

        return doctor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

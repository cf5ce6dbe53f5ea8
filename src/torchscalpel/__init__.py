"""torchscalpel: measure, diagnose, tune, scale and ship an existing PyTorch training script.

The public API is kept small on purpose: most users only touch the ``scalpel`` command line;
notebooks and programs whose loop is a function use :func:`profile` (and :func:`doctor`) in
process; users who scale out use :mod:`torchscalpel.distributed`.
"""

import importlib
from typing import Any

from torchscalpel.record import RunRecord, load_record, save_record

__version__ = "0.1.0"

__all__ = ["RunRecord", "__version__", "doctor", "load_record", "memory", "profile", "save_record"]


def __getattr__(name: str) -> Any:
    # Lazy: ``import torchscalpel`` (and so ``scalpel --help``) must not import torch.
    if name == "profile":
        from torchscalpel.inprocess import profile

        return profile
    if name == "doctor":  # the doctor package is callable: torchscalpel.doctor(...) opens a diagnosed block
        return importlib.import_module("torchscalpel.doctor")
    if name == "memory":  # callable package, as doctor: torchscalpel.memory(...) opens an accounted block
        return importlib.import_module("torchscalpel.memory")
    raise AttributeError(f"module 'torchscalpel' has no attribute {name!r}")

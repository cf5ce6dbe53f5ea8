"""torchscalpel: measure, diagnose, tune, scale and ship an existing PyTorch training script.

The public API is kept small on purpose: most users only touch the ``scalpel`` command line
and, when they scale out, :mod:`torchscalpel.dist`.
"""

from torchscalpel.record import RunRecord, load_record, save_record

__version__ = "0.1.0"

__all__ = ["RunRecord", "__version__", "load_record", "save_record"]

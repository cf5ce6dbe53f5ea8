"""torchscalpel: measure, diagnose, tune, scale and ship an existing PyTorch training script.

The public API is kept small on purpose: most users only touch the ``scalpel`` command line;
notebooks and programs whose loop is a function use :func:`profile`, :func:`doctor` and
:func:`memory` in process, and :func:`plan` and :func:`compare` without a block (docs/inprocess.md).
What they return is exported here too: :class:`InProcessRun` (its ``record``, a :class:`RunRecord`, and
for the doctor its ``findings``, :class:`Finding` objects ranked by :class:`Severity`), :class:`PlanResult`
and :class:`Comparison`. Users who scale out use
:mod:`torchscalpel.distributed`. ``import torchscalpel`` does not import torch (``scalpel --help``
stays fast): the runtime is imported when a block starts.
"""

# Why the subpackages are imported here, before the functions of the same names are bound: the
# import system sets ``torchscalpel.doctor = <the package>`` when the package is first loaded. Loading
# the four packages (doctor, memory, plan, compare) now (their __init__ imports no torch) means that setattr has already happened,
# so the function bound below stays the package attribute whatever a program imports later
# (``from torchscalpel.doctor.api import ...`` finds the package in sys.modules and sets nothing on
# ``torchscalpel``). Each function then carries its package's namespace as its attributes
# (:func:`_lend_namespace`), so a dotted name still reaches every submodule:
# ``import torchscalpel.doctor.api as api`` and ``torchscalpel.doctor.api.diagnose`` work.
from types import ModuleType
from typing import Any

import torchscalpel.compare as _compare_package
import torchscalpel.doctor as _doctor_package
import torchscalpel.memory as _memory_package
import torchscalpel.plan as _plan_package
from torchscalpel.compare.core import Comparison
from torchscalpel.findings import Finding, Severity
from torchscalpel.inprocess import InProcessRun, compare, doctor, memory, plan, profile
from torchscalpel.plan.result import PlanResult
from torchscalpel.record import RunRecord, load_record, save_record, set_inline_html
from torchscalpel.version import __version__

__all__ = [
    "Comparison",
    "Finding",
    "InProcessRun",
    "PlanResult",
    "RunRecord",
    "Severity",
    "__version__",
    "compare",
    "doctor",
    "load_record",
    "memory",
    "plan",
    "profile",
    "save_record",
]


def _inline_summary(record: RunRecord) -> str:
    """A record's report summary for Jupyter; imported on first display (the report imports torch)."""
    from torchscalpel.report.html import inline_summary

    return inline_summary(record)


set_inline_html(_inline_summary)  # the record cannot import the report: it is on the floor below


def _lend_namespace(function: Any, package: ModuleType) -> None:
    """Make ``package``'s namespace ``function``'s attributes, so the dotted names below the package
    resolve through the function that took its name (``torchscalpel.doctor.api`` is the api module).

    ``import a.b.c as m`` and every attribute chain read ``a.b`` as the attribute of ``a``, which here is
    the function; the import system adds each submodule to the package's namespace when it is first
    imported, and sharing that dict (not a copy) lets later imports show through as well. The function's
    own attributes (``__name__``, ``__doc__``, its signature) are descriptors of the function type and win
    over the shared dict, so the function is unchanged to ``inspect`` and to callers.
    """
    function.__dict__ = vars(package)


for _function, _package in (
    (doctor, _doctor_package),
    (memory, _memory_package),
    (plan, _plan_package),
    (compare, _compare_package),
):
    _lend_namespace(_function, _package)
del _function, _package


def __dir__() -> list[str]:
    """The public API only (not the helpers this module imported)."""
    return sorted(__all__)

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
# ``torchscalpel``). Inside the repository, reach a submodule with ``from torchscalpel.doctor import
# api`` or ``from torchscalpel.doctor.api import X``, never as the attribute chain
# ``torchscalpel.doctor.api`` (that is the function's attribute, and there is none).
import torchscalpel.compare as _compare_package  # noqa: F401
import torchscalpel.doctor as _doctor_package  # noqa: F401
import torchscalpel.memory as _memory_package  # noqa: F401
import torchscalpel.plan as _plan_package  # noqa: F401
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


def __dir__() -> list[str]:
    """The public API only (not the helpers this module imported)."""
    return sorted(__all__)

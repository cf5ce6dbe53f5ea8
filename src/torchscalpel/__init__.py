"""torchscalpel: measure, diagnose, tune, scale and ship an existing PyTorch training script.

The public API is kept small on purpose: most users only touch the ``scalpel`` command line;
notebooks and programs whose loop is a function use :func:`profile`, :func:`doctor` and
:func:`memory` in process, and :func:`plan` and :func:`compare` without a block (docs/inprocess.md);
:func:`lr`, :func:`batch`, :func:`tune` and :func:`fix` run a script as their ``scalpel`` verbs do, and
:func:`analyze` reads traces. What they return is exported here too: :class:`InProcessRun` (its ``record``,
a :class:`RunRecord`, and for the doctor its ``findings``, :class:`Finding` objects ranked by
:class:`Severity`), :class:`PlanResult`, :class:`Comparison`, :class:`LrResult`, :class:`BatchResult`,
:class:`TuneRunResult`, :class:`FixResult` and :class:`TraceAnalysis`. Users who scale out use
:mod:`torchscalpel.distributed`. ``import torchscalpel`` does not import torch (``scalpel --help``
stays fast): the runtime is imported when a block starts.
"""

# Why the subpackages are imported here, before the functions of the same names are bound: the
# import system sets ``torchscalpel.doctor = <the package>`` when the package is first loaded. Loading
# the six packages (doctor, memory, plan, compare, tune, fix) now (their __init__ imports no torch) means that setattr has already happened,
# so the function bound below stays the package attribute whatever a program imports later
# (``from torchscalpel.doctor.api import ...`` finds the package in sys.modules and sets nothing on
# ``torchscalpel``). Each function then carries its package's namespace as its attributes
# (:func:`_lend_namespace`), so a dotted name still reaches every submodule:
# ``import torchscalpel.doctor.api as api`` and ``torchscalpel.doctor.api.diagnose`` work.
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torchscalpel.compare as _compare_package
import torchscalpel.doctor as _doctor_package
import torchscalpel.fix as _fix_package
import torchscalpel.memory as _memory_package
import torchscalpel.plan as _plan_package
import torchscalpel.tune as _tune_package
from torchscalpel.compare.core import Comparison
from torchscalpel.findings import Finding, Severity
from torchscalpel.inprocess import (
    InProcessRun,
    analyze,
    batch,
    compare,
    doctor,
    fix,
    lr,
    memory,
    plan,
    profile,
    tune,
)
from torchscalpel.plan.result import PlanResult
from torchscalpel.record import RunRecord, load_record, save_record, set_inline_html
from torchscalpel.stages.lr import LrResult
from torchscalpel.version import __version__

if TYPE_CHECKING:
    from torchscalpel.fix.stage import FixResult
    from torchscalpel.stages.batch import BatchResult
    from torchscalpel.stages.tune import TuneRunResult
    from torchscalpel.trace.analyze import TraceAnalysis


__all__ = [
    "BatchResult",
    "Comparison",
    "Finding",
    "FixResult",
    "InProcessRun",
    "LrResult",
    "PlanResult",
    "RunRecord",
    "Severity",
    "TraceAnalysis",
    "TuneRunResult",
    "__version__",
    "analyze",
    "batch",
    "compare",
    "doctor",
    "fix",
    "load_record",
    "lr",
    "memory",
    "plan",
    "profile",
    "save_record",
    "tune",
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
    (tune, _tune_package),
    (fix, _fix_package),
):
    _lend_namespace(_function, _package)
del _function, _package


def __getattr__(name: str) -> Any:
    """The result types whose modules import torch (the tune search), numpy (the trace reader) or take tens of
    milliseconds (fix's stage, the batch finder), imported when first asked for (PEP 562), so that
    ``import torchscalpel`` (and so every ``scalpel`` command) stays torch-free and quick."""
    if name == "FixResult":
        from torchscalpel.fix.stage import FixResult

        return FixResult
    if name == "BatchResult":
        from torchscalpel.stages.batch import BatchResult

        return BatchResult
    if name == "TuneRunResult":
        from torchscalpel.stages.tune import TuneRunResult

        return TuneRunResult
    if name == "TraceAnalysis":
        from torchscalpel.trace.analyze import TraceAnalysis

        return TraceAnalysis
    raise AttributeError(f"module 'torchscalpel' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API only (not the helpers this module imported)."""
    return sorted(__all__)

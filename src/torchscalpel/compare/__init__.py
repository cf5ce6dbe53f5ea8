"""``scalpel compare``: what differs between runs, measured and recorded, and a one-line verdict.

:func:`compare_runs` loads records (run folders or ``run.json`` files) and returns a
:class:`~torchscalpel.compare.core.Comparison`; :mod:`~torchscalpel.report.compare_terminal` prints it,
:mod:`~torchscalpel.report.compare_page` renders the HTML report. Nothing here re-measures anything.
"""

from torchscalpel.compare.core import Comparison, compare_records, compare_runs

__all__ = ["Comparison", "compare_records", "compare_runs"]

"""The fix stage: ``scalpel fix``'s one entry point over :mod:`torchscalpel.fix.stage` (plan, edit, check,
write the patch, apply, verify). Nothing here prints: the CLI writes the diff and the summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchscalpel.fix.options import FixOptions
from torchscalpel.fix.stage import FixResult


def run(options: FixOptions, *, progress: Callable[[Any], None] | None = None) -> FixResult:
    """The patch of the user's own files that the runs in ``options.run_dirs`` measured, written, applied and
    verified as ``options`` ask (needs ``torchscalpel[fix]``: libcst). ``progress`` is not called: the
    verification's runs draw their own."""
    from torchscalpel.fix.stage import run as patch_runs

    return patch_runs(options)

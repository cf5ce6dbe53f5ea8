"""``scalpel fix``: the measured change as a patch to the user's own code (docs/fix.md)."""

from __future__ import annotations

from torchscalpel.fix.options import FixOptions
from torchscalpel.fix.stage import FixResult
from torchscalpel.fix.stage import run as run_fix

__all__ = ["FixOptions", "FixResult", "run_fix"]

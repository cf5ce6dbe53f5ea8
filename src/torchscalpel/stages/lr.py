"""The lr stage: run the range test over the options' target, save run.json first, then report.html."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchscalpel.lrfind.options import LrOptions
from torchscalpel.record import RunRecord
from torchscalpel.sections import LrSection
from torchscalpel.stages.saving import save_with_report


@dataclass(frozen=True, kw_only=True, slots=True)
class LrResult:
    """One learning-rate range test: the record (its ``sections["lr"]``: the sweep, the suggestion or why
    there is none) and where it was written."""

    record: RunRecord
    out_dir: Path
    report: Path | None
    """report.html, or None when none was asked for or it could not be rendered."""

    @property
    def section(self) -> LrSection:
        """The sweep as a typed view (empty when the run ended before the sweep began)."""
        return self.record.section(LrSection) or LrSection()

    @property
    def suggested_lr(self) -> float | None:
        """The lr at the steepest descent of the smoothed loss (None when the sweep cannot say)."""
        suggestion = self.section.suggestion
        return float(suggestion["lr"]) if suggestion and suggestion.get("lr") is not None else None

    @property
    def exit_code(self) -> int:
        """The script's own exit code (0 when it was stopped after the sweep)."""
        return int(self.record.exit_code or 0)


def run(options: LrOptions, *, progress: Callable[[Any], None] | None = None) -> LrResult:
    """Sweep the learning rate over ``options.target`` (the run folder: ``options.out_dir``, else
    ``scalpel-runs/<time>-lr-<name>/``); write run.json, then report.html. ``progress``: once per step."""
    from torchscalpel.fileio import default_run_dir
    from torchscalpel.lrfind.run import find_lr

    target = options.target
    if target is None:
        raise ValueError("the lr stage needs options.target (the script or module to sweep)")
    out_dir = options.out_dir or default_run_dir(f"lr-{target.name}", options.out_root)
    options = options.replace(out_dir=out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = find_lr(target, options, progress=progress, command=list(options.command))
    report = save_with_report(record, out_dir, write_report=options.report)
    return LrResult(record=record, out_dir=out_dir, report=report)

"""The lr stage: run the range test, save run.json first, then report.html; print the summary."""

from __future__ import annotations

import sys
from pathlib import Path

from torchscalpel.lrfind.options import LrOptions
from torchscalpel.record import RunRecord
from torchscalpel.runtime.target import Target
from torchscalpel.stages.saving import save_with_report


def run_lr(target: Target, options: LrOptions, *, write_report: bool = True) -> RunRecord:
    """Sweep the learning rate over ``target`` (``options.out_dir`` is required); write the record and the page."""
    from torchscalpel.console import StepProgress
    from torchscalpel.lrfind.run import find_lr

    if options.out_dir is None:
        raise ValueError("run_lr needs options.out_dir")
    out_dir: Path = options.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    with StepProgress(options.steps, f"sweeping the learning rate of {target.name}") as bar:
        record = find_lr(target, options, progress=bar.update, command=["scalpel", *sys.argv[1:]])
    save_with_report(record, out_dir, write_report=write_report)
    return record

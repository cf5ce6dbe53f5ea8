"""The profile stage: run a target under the runtime, add the trace summary, save and report."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from torchscalpel.record import RunRecord
from torchscalpel.runtime.observer import Observer
from torchscalpel.runtime.session import RuntimeOptions, SetupHook
from torchscalpel.runtime.target import Target
from torchscalpel.runtime.trace_summary import add_trace_summary
from torchscalpel.stages.saving import save_with_report


def profile_target(
    target: Target,
    options: RuntimeOptions,
    *,
    write_report: bool = True,
    json_path: Path | None = None,
    quiet: bool = False,
    observers: Sequence[Observer] = (),
    setup_hooks: Sequence[SetupHook] = (),
) -> tuple[RunRecord, Path]:
    """Run ``target``, enrich its record with the trace summary, save everything, print the summary."""
    from torchscalpel.console import StepProgress
    from torchscalpel.runtime.session import run_target

    if options.out_dir is None:
        raise ValueError("profile_target needs options.out_dir")
    out_dir: Path = options.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    total = options.warmup + options.steps if options.steps is not None else None
    with StepProgress(total, f"profiling {target.name}") as bar:
        record = run_target(
            target, options, observers, setup_hooks, progress=bar.update, command=["scalpel", *sys.argv[1:]]
        )
    finish_profile(record, out_dir, write_report=write_report, json_path=json_path, quiet=quiet)
    return record, out_dir


def finish_profile(
    record: RunRecord,
    out_dir: Path,
    *,
    write_report: bool = True,
    json_path: Path | None = None,
    quiet: bool = False,
) -> None:
    """Everything after the run: trace summary, run.json, report.html, the optional JSON copy, the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    add_trace_summary(record, out_dir)
    save_with_report(record, out_dir, write_report=write_report)
    try:
        if (
            json_path is not None
        ):  # the user's path: a full disk or /dev/full is one sentence (run.json is kept)
            from torchscalpel.fileio import write_output_text
            from torchscalpel.record import record_json

            write_output_text(json_path, record_json(record), flag="--json")
    finally:  # the summary of what was measured is shown even when the copy could not be written
        if not quiet:
            import torchscalpel.report.profile_terminal as profile_terminal

            profile_terminal.render(record, out_dir)

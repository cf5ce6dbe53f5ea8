"""The profile stage: run a target under the runtime, add the trace summary, save and report.

:func:`run` is ``scalpel profile``'s one entry point; :func:`finish_profile` is the ending the in-process
block (``torchscalpel.profile``) shares with it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchscalpel.errors import UsageError
from torchscalpel.record import RunRecord
from torchscalpel.runtime.profile_options import ProfileOptions
from torchscalpel.runtime.trace_summary import add_trace_summary
from torchscalpel.stages.saving import save_with_report, track_run


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileResult:
    """One ``scalpel profile`` run: the record (phases, ops, memory, FLOP/s, the trace summary) and where it
    was written."""

    record: RunRecord
    out_dir: Path
    report: Path | None
    """report.html, or None when none was asked for or it could not be rendered."""
    json_error: UsageError | None = None
    """Why ``--json`` could not be written (run.json is kept; the summary is still shown)."""
    tracked: list[str] = field(default_factory=list)
    """One line per tracker written (``--tensorboard`` / ``--mlflow``)."""

    @property
    def exit_code(self) -> int:
        """The script's own exit code."""
        return int(self.record.exit_code or 0)


def run(options: ProfileOptions, *, progress: Callable[[Any], None] | None = None) -> ProfileResult:
    """Run ``options.target`` in the window ``options`` asks (the ``[tune]`` settings of ``options.config``
    applied), add the trace summary, write run.json, report.html and the ``--json`` copy into
    ``options.out_dir`` (default ``scalpel-runs/<time>-<name>/``), then hand the run to the trackers.
    ``progress``: once per step."""
    from torchscalpel.fileio import default_run_dir
    from torchscalpel.runtime.session import run_target
    from torchscalpel.tune.applied import settings_hooks

    target = options.target
    if target is None:
        raise ValueError("the profile stage needs options.target (the script or module to run)")
    out_dir = options.out_dir or default_run_dir(target.name, options.out_root)
    out_dir.mkdir(parents=True, exist_ok=True)
    tuned = settings_hooks(options.config, command="scalpel profile") if options.config is not None else {}
    record = run_target(
        target,
        options.runtime(out_dir=out_dir, name=options.name or target.name),
        tuned.get("observers", ()),
        tuned.get("setup_hooks", ()),
        progress=progress,
        command=list(options.command),
    )
    add_trace_summary(record, out_dir)
    report = save_with_report(record, out_dir, write_report=options.report)
    json_error: UsageError | None = None
    if options.json_path is not None:  # the user's path: a full disk or /dev/full is one sentence
        from torchscalpel.fileio import write_output_text
        from torchscalpel.record import record_json

        try:
            write_output_text(options.json_path, record_json(record), flag="--json")
        except UsageError as exc:  # raised by the CLI after the summary of what was measured
            json_error = exc
    tracked = (
        []
        if json_error
        else track_run(record, out_dir, tensorboard=options.tensorboard, mlflow=options.mlflow)
    )
    return ProfileResult(
        record=record, out_dir=out_dir, report=report, json_error=json_error, tracked=tracked
    )


def finish_profile(
    record: RunRecord,
    out_dir: Path,
    *,
    write_report: bool = True,
    json_path: Path | None = None,
    quiet: bool = False,
) -> Path | None:
    """Everything after the run: trace summary, run.json, report.html, the optional JSON copy, the summary
    (unless ``quiet``); returns report.html's path (None when none was written)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    add_trace_summary(record, out_dir)
    report = save_with_report(record, out_dir, write_report=write_report)
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
    return report

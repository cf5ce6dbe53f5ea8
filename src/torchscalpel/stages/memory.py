"""The memory stage: run a target under the memory observer, save the record, write the patch.

:func:`run` is ``scalpel memory``'s one entry point; :func:`make_observer`, :func:`observer_setup` and
:func:`finish` are the pieces the in-process block (``torchscalpel.memory``) shares with it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchscalpel.errors import UsageError
from torchscalpel.memory.observer import MemoryObserver
from torchscalpel.memory.options import MemoryOptions
from torchscalpel.record import RunRecord
from torchscalpel.runtime.session import SetupHook
from torchscalpel.sections import MemorySection
from torchscalpel.stages.saving import save_with_report


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryResult:
    """One ``scalpel memory``: a script run's record (``sections["memory"]``: breakdown, growth, post-mortem and
    fix ladder), where it was written and what ``--patch`` wrote; or a snapshot's explanation."""

    record: RunRecord | None = None
    out_dir: Path | None = None
    report: Path | None = None
    """report.html, or None when none was asked for or it could not be rendered."""
    patch_lines: list[str] = field(default_factory=list)
    snapshot: dict[str, Any] | None = None
    """A snapshot's explanation (``options.snapshot``)."""
    page: Path | None = None
    """The snapshot's HTML page, when one was asked for and written."""
    output_error: UsageError | None = None
    """Why the snapshot's ``--json`` or ``--html`` copy could not be written (raised after the summary)."""

    @property
    def section(self) -> MemorySection:
        """``sections["memory"]`` through its typed view (empty when the run measured nothing, or for a snapshot)."""
        view = self.record.section(MemorySection) if self.record is not None else None
        return view if view is not None else MemorySection()

    @property
    def caught_by_script(self) -> bool:
        """The script caught the stop at the limit and went on: the run did not fit."""
        return bool((self.section.oom or {}).get("caught_by_script"))

    @property
    def exit_code(self) -> int:
        """1 when the script swallowed the stop at the limit, else the script's own exit code."""
        if self.caught_by_script:
            return 1
        return int(self.record.exit_code or 0) if self.record is not None else 0


def run(options: MemoryOptions, *, progress: Callable[..., None] | None = None) -> MemoryResult:
    """Run ``options.target`` with tensor-level accounting in the window ``options`` asks (and its memory
    limit, when given), the ``[tune]`` settings of ``options.config`` applied; write run.json, report.html,
    the JSON copy and (``options.patch``) fix.patch into ``options.out_dir`` (default
    ``scalpel-runs/<time>-memory-<name>/``). ``progress``: once per step. With ``options.snapshot``, explain
    that snapshot instead (``progress(bytes_done, bytes_total)`` as the reader goes) and write its JSON and
    HTML copies."""
    from torchscalpel.fileio import default_run_dir
    from torchscalpel.runtime.session import run_target

    if options.snapshot is not None:
        return _explain(options, progress)

    target = options.target
    if target is None:
        raise ValueError("the memory stage needs options.target (the script or module to run)")
    out_dir = options.out_dir or default_run_dir(f"memory-{target.name}", options.out_root)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings_hooks: list[SetupHook] = []
    if options.config is not None:
        from torchscalpel.tune.apply import setup_hooks
        from torchscalpel.tune.knobs import ApplyLog
        from torchscalpel.tune.settings import read_settings_file

        settings_hooks = list(setup_hooks(read_settings_file(options.config), ApplyLog()))
    observer = make_observer(options)
    record = run_target(
        target,
        options.runtime(out_dir=out_dir, name=f"memory-{target.name}"),
        observers=[observer],
        setup_hooks=[*settings_hooks, observer_setup(observer)],
        progress=progress,
        command=list(options.command),
    )
    report = finish(record, out_dir, json_path=options.json_path, write_report=options.report)
    patch_lines: list[str] = []
    if options.patch:
        from torchscalpel.fix.shortcut import write_run_patch

        patch_lines = list(write_run_patch(out_dir))
    return MemoryResult(record=record, out_dir=out_dir, report=report, patch_lines=patch_lines)


def _explain(options: MemoryOptions, progress: Callable[..., None] | None) -> MemoryResult:
    import json

    from torchscalpel.fileio import write_output_text
    from torchscalpel.memory.snapshot import explain_snapshot
    from torchscalpel.report.snapshot_page import write_snapshot_page

    assert options.snapshot is not None
    result = explain_snapshot(options.snapshot, progress)
    error: UsageError | None = None
    page: Path | None = None
    try:
        if options.json_path is not None:
            write_output_text(options.json_path, json.dumps(result, indent=1) + "\n", flag="--json")
        if options.html_path is not None:
            try:
                write_snapshot_page(result, options.html_path)
            except OSError as exc:
                raise UsageError(
                    f"Cannot write {options.html_path}: {exc.strerror or exc}; give a writable --html path."
                ) from None
            page = options.html_path
    except UsageError as exc:
        error = exc
    return MemoryResult(snapshot=result, page=page, output_error=error)


def make_observer(options: MemoryOptions) -> MemoryObserver:
    """The memory observer ``options`` ask for (the limit, the plan's numbers, the until-eval stop)."""
    return MemoryObserver(limit=options.memory_limit, plan=options.plan, until_eval=options.until_eval_steps)


def observer_setup(observer: MemoryObserver) -> SetupHook:
    """The plan observer's keyword capture, as a runtime setup hook."""

    def setup() -> Any:
        if observer.plan_observer is not None:
            return observer.plan_observer.setup_hook()
        return None

    return setup


def finish(record: RunRecord, out_dir: Path, *, json_path: Path | None, write_report: bool) -> Path | None:
    """Save the record first (a report that fails to render loses nothing), then the report and the JSON copy;
    returns the report's path (None when none was written)."""
    import json

    record.artifacts["record"] = "run.json"
    section = record.sections.get("memory")
    if isinstance(section, dict) and (section.get("oom") or {}).get("snapshot"):
        record.artifacts["memory_live"] = "memory-live.json"
    report = save_with_report(record, out_dir, write_report=write_report)
    if json_path is not None:  # after run.json: a --json that fails (a full disk) costs nothing measured
        from torchscalpel.fileio import write_output_text

        write_output_text(json_path, json.dumps(section, indent=1, default=str) + "\n", flag="--json")
    return report

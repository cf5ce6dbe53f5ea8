"""The memory stage: run a target under the memory observer, save the record, print the summary."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchscalpel.memory.observer import MemoryObserver
from torchscalpel.memory.options import MemoryOptions
from torchscalpel.record import RunRecord
from torchscalpel.runtime.session import SetupHook
from torchscalpel.runtime.target import Target
from torchscalpel.stages.saving import save_with_report


def run_memory(
    target: Target,
    options: MemoryOptions,
    *,
    out_dir: Path,
    json_path: Path | None = None,
    write_report: bool = True,
    setup_hooks: Sequence[SetupHook] = (),
) -> RunRecord:
    """Run ``target`` with tensor-level accounting in the window ``options`` asks (and its memory limit, when
    given); write run.json and report.html into ``out_dir``."""
    from torchscalpel.runtime.session import run_target

    out_dir.mkdir(parents=True, exist_ok=True)
    observer = make_observer(options)
    record = run_target(
        target,
        options.runtime(out_dir=out_dir, name=f"memory-{target.name}"),
        observers=[observer],
        setup_hooks=[*setup_hooks, observer_setup(observer)],
        command=["scalpel", *sys.argv[1:]],
    )
    finish(record, out_dir, json_path=json_path, write_report=write_report)
    return record


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


def finish(record: RunRecord, out_dir: Path, *, json_path: Path | None, write_report: bool) -> None:
    """Save the record first (a report that fails to render loses nothing), then the report and the JSON copy."""
    import json

    record.artifacts["record"] = "run.json"
    section = record.sections.get("memory")
    if isinstance(section, dict) and (section.get("oom") or {}).get("snapshot"):
        record.artifacts["memory_live"] = "memory-live.json"
    save_with_report(record, out_dir, write_report=write_report)
    if json_path is not None:  # after run.json: a --json that fails (a full disk) costs nothing measured
        from torchscalpel.fileio import write_output_text

        write_output_text(json_path, json.dumps(section, indent=1, default=str) + "\n", flag="--json")

"""``scalpel profile [options] -- SCRIPT [ARGS]``: split every step of an unmodified script into phases.

Writes ``run.json`` (the Run record), ``report.html`` and ``trace.json.gz`` into the run folder,
also when the script fails or is interrupted; exits with the script's own code in that case.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torchscalpel.cli.common import (
    Target,
    add_output_arguments,
    add_target_arguments,
    default_run_dir,
    resolve_target,
)
from torchscalpel.errors import UsageError
from torchscalpel.record import RunRecord, save_record

DEFAULT_EXAMPLE = "char_transformer.py"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``profile`` sub-command."""
    p = subparsers.add_parser(
        "profile",
        help="time every step of a script: data / forward / backward / optimizer / other",
        description="Run a training script unmodified and split every step into data wait, forward, "
        "backward, optimizer and other, with top ops, memory, FLOP/s, a trace and an HTML report. "
        f"Without a script, profiles examples/{DEFAULT_EXAMPLE}.",
    )
    add_runtime_arguments(p)
    add_output_arguments(p)
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    add_target_arguments(p, required=False)
    p.set_defaults(func=run)
    return p


def add_runtime_arguments(p: argparse.ArgumentParser) -> None:
    """``--warmup``, ``--steps``, ``--profile-steps``, ``--module-times`` (shared with doctor and tune)."""
    p.add_argument("--warmup", type=int, default=2, help="steps to run before measuring (default 2)")
    p.add_argument("--steps", default="20", help="measured steps, then stop the script; 'all' lets it finish (default 20)")
    p.add_argument("--profile-steps", type=int, default=3, help="steps inside the torch.profiler window; 0 disables (default 3)")
    p.add_argument("--module-times", action="store_true", help="also time each submodule's forward")
    p.add_argument("--step-kind", choices=("auto", "optimizer", "backward", "forward"), default="auto",
                   help="what ends a step: auto (optimizer steps when there are any, else backward calls, "
                   "else forward calls) or one fixed kind (default auto)")
    p.add_argument("--step-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="stop the script when no step is recognised this long after the start (default 600)")


def parse_steps(text: str) -> int | None:
    """``'all'`` -> None, else a positive int; a UsageError naming --steps otherwise."""
    if str(text).lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--steps takes a number or 'all', not {text!r}.") from None
    if value < 1:
        raise UsageError("--steps must be at least 1 (or 'all').")
    return value


def runtime_options(args: argparse.Namespace, out_dir: Path | None, name: str) -> Any:
    """RuntimeOptions from parsed flags; ValueError from validation becomes a UsageError."""
    from torchscalpel.runtime.session import RuntimeOptions

    try:
        return RuntimeOptions(
            warmup=args.warmup,
            steps=parse_steps(args.steps),
            out_dir=out_dir,
            profile_steps=args.profile_steps,
            module_times=args.module_times,
            name=name,
            step_kind=args.step_kind,
            step_timeout_s=args.step_timeout,
        )
    except ValueError as exc:
        raise UsageError(f"{exc}.") from None


def run(args: argparse.Namespace) -> int:
    """Validate, run the script under the runtime, write record + report + trace, print the summary."""
    from torchscalpel.examples import example_script

    default = None if args.module or args.target else example_script(DEFAULT_EXAMPLE)
    target = resolve_target(args, default_script=default)
    if default is not None:
        # The default example, sized so the demo is quick on a laptop CPU.
        target.args = ["--steps", "60", "--log-every", "20"]
    out_dir = args.out or default_run_dir(target.name)
    options = runtime_options(args, out_dir, target.name)
    record, _ = profile_target(target, options, write_report=not args.no_report, json_path=args.json_path)
    return record.exit_code or 0


def profile_target(
    target: Target, options: Any, *, write_report: bool = True, json_path: Path | None = None, quiet: bool = False
) -> tuple[RunRecord, Path]:
    """Run, enrich with the trace summary, save everything, print the summary. Used by demo too."""
    import sys

    from torchscalpel.report.terminal import StepProgress, print_profile_summary
    from torchscalpel.runtime.session import run_target

    out_dir: Path = options.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    total = options.warmup + options.steps if options.steps is not None else None
    with StepProgress(total, f"profiling {target.name}") as bar:
        record = run_target(target, options, progress=bar.update, command=["scalpel", *sys.argv[1:]])
    add_trace_summary(record, out_dir)
    save_record(record, out_dir)
    record.artifacts["record"] = "run.json"
    if write_report:
        from torchscalpel.report.html import write_report

        write_report(record, out_dir / "report.html")
        record.artifacts["report"] = "report.html"
    save_record(record, out_dir)
    if json_path is not None:
        save_record(record, json_path)
    if not quiet:
        print_profile_summary(record, out_dir)
    return record, out_dir


def add_trace_summary(record: RunRecord, out_dir: Path) -> None:
    """Op-level summary of the profiler window's trace, from the shared trace module."""
    trace_name = record.profiler.get("trace")
    if not trace_name:
        return
    record.artifacts["trace"] = trace_name
    from torchscalpel.trace import analyze_traces

    try:
        result = analyze_traces([out_dir / trace_name]).to_dict()
    except Exception as exc:  # a trace we cannot read must not cost the user the run record
        record.notes.append(f"trace summary failed: {exc}")
        return
    record.sections["trace"] = result  # read through record.op_summary(); kept once

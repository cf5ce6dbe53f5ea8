"""``scalpel doctor [options] -- SCRIPT [ARGS]`` and ``scalpel doctor --static PATH...``.

Runs the script for a short window under every runtime rule, adds static analysis of the script
and of the model sources it uses, and prints findings ranked by severity. Writes ``run.json``
(findings included) and ``report.html`` into the run folder; ``--json``, ``--sarif`` and
``--fail-on`` serve CI.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchscalpel.cli.common import (
    add_target_arguments,
    add_tracking_arguments,
    add_window_arguments,
    default_run_dir,
    resolve_target,
    steps_arg,
    track,
)
from torchscalpel.doctor.window import DEFAULT_STEPS, DOCTOR_WINDOW, TIME_CAP_S
from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.fileio import write_output_text
from torchscalpel.options import usage_error
from torchscalpel.units import duration_type, int_type


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``doctor`` sub-command."""
    p = subparsers.add_parser(
        "doctor",
        help="find training-script pitfalls, with evidence and the fix",
        description="Run a training script for a few steps under runtime rules plus static analysis and "
        "report pitfalls (unregistered modules, grads never zeroed, NaN origin, loader bottlenecks, DDP "
        "mistakes, unsafe checkpoints, ...) ranked by severity. See docs/doctor.md.",
    )
    p.add_argument(
        "--static",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="only run the static rules over these files/folders (fast; no script is run)",
    )
    add_window_arguments(
        p,
        warmup=DOCTOR_WINDOW.warmup,
        steps="auto",
        steps_help=f"{DEFAULT_STEPS} steps, within the --time-cap",
    )
    p.add_argument(
        "--time-cap",
        type=duration_type("--time-cap", allow_zero=True),  # seconds, the shared duration rule and bound
        default=TIME_CAP_S,
        metavar="SECONDS",
        help=f"stop a slow script after this long even before its steps are done, and say so in the "
        f"output and run.json (default {TIME_CAP_S:.0f}; 0: no cap)",
    )
    p.add_argument(
        "--nproc",
        type=int_type("--nproc", minimum=1),
        default=None,
        help="run the script on this many ranks through 'scalpel launch' (torchrun; gloo on CPU) and merge "
        "the findings; without it the script runs in-process exactly as 'python SCRIPT' would",
    )
    p.add_argument(
        "--sanity", action="store_true", help="also try to overfit one batch (rule cannot-overfit-batch)"
    )
    p.add_argument("--no-static", action="store_true", help="skip static analysis in a script run")
    p.add_argument(
        "--json",
        dest="json_path",
        type=Path,
        metavar="FILE",
        help="write the findings as JSON here (- for standard output)",
    )
    p.add_argument("--sarif", type=Path, help="write static findings as SARIF 2.1.0 here")
    p.add_argument(
        "--fail-on", choices=("info", "warning", "error"), help="exit 1 when a finding reaches this severity"
    )
    p.add_argument("--out", type=Path, help="run folder (default scalpel-runs/<time>-<name>/)")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument(
        "--patch",
        action="store_true",
        help="also write fix.patch in the run folder: the diff of your code 'scalpel fix RUN_DIR' prints "
        "(needs torchscalpel[fix])",
    )
    add_tracking_arguments(p)
    add_target_arguments(p, required=False)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Validate flags, then run the static-only or the full doctor."""
    from torchscalpel.findings import Severity

    fail_on = Severity.parse(args.fail_on) if args.fail_on else None
    args.steps = steps_arg(args)
    if not (math.isfinite(args.time_cap) and args.time_cap >= 0):  # nan and inf included
        raise UsageError("--time-cap must be 0 (no cap) or a number of seconds.")
    if args.nproc is not None and args.nproc < 1:
        raise UsageError("--nproc must be at least 1.")
    if args.patch and (args.static is not None or args.nproc is not None):
        raise UsageError("--patch goes with a script run of one process, not with --static or --nproc.")
    if args.static is not None:
        if args.target or args.module:
            raise UsageError(
                "--static takes paths, not a script to run; drop the '-- SCRIPT' part or drop --static."
            )
        return _run_static(args, fail_on)
    if not args.target and not args.module:
        raise UsageError(
            "Name the script to check after --, e.g. 'scalpel doctor -- train.py', or pass --static PATH."
        )
    if args.nproc is not None:
        return _run_ranks(args, fail_on)
    return _run_script(args, fail_on)


def _run_ranks(args: argparse.Namespace, fail_on: Any) -> int:
    """``--nproc N``: every rank under the doctor via ``scalpel launch --doctor``, findings merged."""
    from torchscalpel.console import make_console
    from torchscalpel.doctor.ranks import across_rank_findings, merge_rank_findings, run_ranks
    from torchscalpel.findings import without_launcher_repeats
    from torchscalpel.report.doctor_terminal import reaches, render_rank_findings

    if args.module:
        raise UsageError("--nproc runs a script file; pass the script path instead of -m.")
    target = resolve_target(args)
    if target.script is None or not target.script.is_file():
        raise UsageError("--nproc needs a script file after --.")
    out_dir = args.out or default_run_dir(f"doctor-{target.name}")
    console = make_console()
    console.print(
        f"[bold]scalpel doctor[/bold]: {target.name} on {args.nproc} ranks (scalpel launch --doctor); "
        "each rank's findings are merged into one list below"
    )
    code, records = run_ranks(target.script, target.args, nproc=args.nproc, steps=args.steps, out=out_dir)
    if not records:
        raise ScalpelError(
            f"No rank wrote a run record under {out_dir}; see the rank logs in {out_dir / 'logs'}."
        )
    across = across_rank_findings(out_dir)
    per_rank = without_launcher_repeats(across, merge_rank_findings(records))
    findings = across + per_rank
    render_rank_findings(
        across,
        per_rank,
        console,
        ranks=args.nproc,
        header=f"[dim]{len(records)} rank record(s) under {out_dir}[/dim]\n",
    )
    _write_outputs(
        args,
        findings,
        {
            "mode": "ranks",
            "nproc": args.nproc,
            "ranks": sorted(records),
            "records": [str(out_dir / f"rank-{r}" / "run.json") for r in sorted(records)],
        },
    )
    if reaches(findings, fail_on):
        return 1
    return code


def _write_outputs(
    args: argparse.Namespace, findings: list[Any], meta: dict[str, Any], not_analysed: Sequence[Any] = ()
) -> None:
    from torchscalpel.doctor.sarif import to_sarif
    from torchscalpel.report.doctor_terminal import to_json
    from torchscalpel.version import __version__

    if args.json_path is not None:
        write_output_text(
            args.json_path, json.dumps(to_json(findings, **meta), indent=1, default=str) + "\n", flag="--json"
        )
    if args.sarif is not None:
        static = [f for f in findings if f.source == "static"]
        write_output_text(
            args.sarif,
            json.dumps(to_sarif(static, version=__version__, not_analysed=not_analysed), indent=1) + "\n",
            flag="--sarif",
        )


def _run_static(args: argparse.Namespace, fail_on: Any) -> int:
    import torchscalpel.report.doctor_terminal as doctor_terminal
    from torchscalpel.console import make_console
    from torchscalpel.doctor.registry import rank_findings
    from torchscalpel.doctor.static_scan import analyze_paths, iter_python_files
    from torchscalpel.report.doctor_terminal import reaches

    files = list(iter_python_files(args.static))
    skipped: list[Any] = []
    findings = rank_findings(analyze_paths(files, not_analysed=skipped))
    doctor_terminal.render(
        findings,
        make_console(),
        header=f"[bold]scalpel doctor --static[/bold]: {len(files)} file(s)",
        not_analysed=skipped,
    )
    _write_outputs(
        args,
        findings,
        {"mode": "static", "files": [str(f) for f in files], "not_analysed": [s.to_dict() for s in skipped]},
        skipped,
    )
    # A CI gate never passes code it could not read.
    return 1 if reaches(findings, fail_on) or (fail_on is not None and skipped) else 0


def _run_script(args: argparse.Namespace, fail_on: Any) -> int:
    from rich.markup import escape

    import torchscalpel.report.doctor_terminal as doctor_terminal
    from torchscalpel.console import make_console, say_command
    from torchscalpel.doctor.api import diagnose
    from torchscalpel.doctor.options import DoctorOptions
    from torchscalpel.doctor.ranks import MERGED_RANKS_ENV
    from torchscalpel.report.doctor_terminal import reaches
    from torchscalpel.report.profile_terminal import strip_ansi
    from torchscalpel.runtime.run_notes import how_it_stopped
    from torchscalpel.stages.saving import save_with_report

    target = resolve_target(args)
    out_dir = args.out or default_run_dir(f"doctor-{target.name}")
    try:  # validated before the script starts and before the run folder exists
        options = DoctorOptions.from_args(args, out_dir=out_dir)
    except ValueError as exc:
        raise usage_error(exc) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    console = make_console()
    planned = options.planned_steps
    window = (
        "every step, until the script ends"
        if planned is None
        else f"{options.warmup} warm-up + {planned} steps"
    )
    if options.cap_s:
        window += f" (time cap {options.cap_s:.0f} s)"
    console.print(
        f"[bold]scalpel doctor[/bold]: running {target.name} for {window}"
        + (" (+ overfit-one-batch check)" if options.sanity else "")
    )
    from torchscalpel.console import StepProgress

    total = None if planned is None else options.warmup + planned
    # grows past the planned count, never "33 of 32"; its time left never exceeds what the cap leaves
    with StepProgress(total, f"doctor {target.name}", time_cap_s=options.time_cap_s) as bar:
        record, findings = diagnose(target, options, command=["scalpel", *sys.argv[1:]], progress=bar.update)
    save_with_report(record, out_dir, write_report=not args.no_report)
    measured = len(record.measured_steps)
    status = (f"{how_it_stopped(record)} ({len(record.steps) - measured} warm-up + {measured} measured)") + (
        f": {strip_ansi(record.error)}" if record.error else ""
    )
    capped = record.sections["doctor"].get("window", {}).get("capped")
    if capped:
        status += f"\nwindow shortened: {capped}"
    if os.environ.get(MERGED_RANKS_ENV) == "1":  # doctor --nproc prints the merged list once, not per rank
        console.print(f"[dim]{escape(status)}; {len(findings)} finding(s) in {out_dir / 'run.json'}[/dim]")
    else:
        doctor_terminal.render(findings, console, header=f"[dim]{escape(status)}[/dim]\n")
    # A failed run's launcher advice is the script-failed finding's fix (above), the script's arguments kept.
    console.print(f"[dim]record: {out_dir / 'run.json'}[/dim]")
    track(args, record, out_dir)
    if args.patch:
        from torchscalpel.fix.shortcut import write_run_patch

        for line in write_run_patch(out_dir):
            console.print(escape(line), soft_wrap=True)
    if os.environ.get(MERGED_RANKS_ENV) != "1":
        target_argv = target.argv() if target.script else ["-m", *target.argv()]
        if record.status == "failed":  # tuning a script that does not run measures nothing
            again = shlex.join(["scalpel", "doctor", "--", *target_argv])
            say_command(console, "next: fix the failure above, then run the doctor again:", again)
        else:
            script = shlex.join(["scalpel", "tune", "--", *target_argv])
            if findings:
                say_command(console, "next: apply the fix(es) above and run the doctor again, then", script)
            else:
                say_command(console, "next:", script, "(measured speedups)")
    _write_outputs(
        args,
        findings,
        {
            "mode": "run",
            "status": record.status,
            "steps": len(record.steps),
            "window": record.sections["doctor"].get("window"),
            "record": str(out_dir / "run.json"),
        },
    )
    if record.status == "failed" and record.exit_code:
        return (
            record.exit_code
        )  # the script's own failure wins: it is the first finding, and CI sees it as python would
    if reaches(findings, fail_on):
        return 1
    return record.exit_code or 0

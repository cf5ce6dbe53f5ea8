"""``scalpel doctor [options] -- SCRIPT [ARGS]`` and ``scalpel doctor --static PATH...``.

Runs the script for a short window under every runtime rule, adds static analysis of the script
and of the model sources it uses, and prints findings ranked by severity. Writes ``run.json``
(findings included) and ``report.html`` into the run folder; ``--json``, ``--sarif`` and
``--fail-on`` serve CI.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchscalpel.cli.common import add_target_arguments, add_tracking_arguments, add_window_arguments
from torchscalpel.doctor.window import DEFAULT_STEPS, DOCTOR_WINDOW, TAIL_CAP_S, TIME_CAP_S
from torchscalpel.options import usage_error
from torchscalpel.units import duration_type, int_type

if TYPE_CHECKING:
    from rich.console import Console

    from torchscalpel.stages.doctor import DoctorResult


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
        "--tail-cap",
        type=duration_type("--tail-cap", allow_zero=True),
        default=None,
        metavar="SECONDS",
        help="after the window's steps, let the script run on this long under the cheap checks only (saves, "
        f"loads, exports at its end; no timing) and say so (default {TAIL_CAP_S:.0f} with the default --steps, "
        "none with a --steps you chose; 0: stop at the window)",
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
    """Flags -> :class:`DoctorOptions` -> :func:`torchscalpel.stages.doctor.run` -> the findings on screen
    and the exit code."""
    import torchscalpel.report.doctor_terminal as doctor_terminal
    from torchscalpel.console import StepProgress, make_console
    from torchscalpel.doctor.options import DoctorOptions
    from torchscalpel.report.doctor_terminal import render_rank_findings
    from torchscalpel.stages import doctor as stage

    try:  # every flag checked before the script starts and before the run folder exists
        options = DoctorOptions.from_args(args)
    except ValueError as exc:
        raise usage_error(exc) from None
    console = make_console()
    if options.mode == "static":
        result = stage.run(options)
        doctor_terminal.render(
            result.findings,
            console,
            header=f"[bold]scalpel doctor --static[/bold]: {len(result.files)} file(s)",
            not_analysed=result.not_analysed,
        )
        return result.exit_code
    assert options.target is not None  # from_args resolved it
    name = options.target.name
    if options.mode == "ranks":
        console.print(
            f"[bold]scalpel doctor[/bold]: {name} on {options.nproc} ranks (scalpel launch --doctor); "
            "each rank's findings are merged into one list below"
        )
        result = stage.run(options)
        render_rank_findings(
            result.across_ranks,
            result.per_rank,
            console,
            ranks=int(options.nproc or 1),
            header=f"[dim]{len(result.rank_records)} rank record(s) under {result.out_dir}[/dim]\n",
        )
        return result.exit_code
    planned = options.planned_steps
    window = (
        "every step, until the script ends"
        if planned is None
        else f"{options.warmup} warm-up + {planned} steps"
    )
    if options.cap_s:
        window += f" (time cap {options.cap_s:.0f} s)"
    if options.tail_s:
        window += f", then up to {options.tail_s:.0f} s more under the cheap checks"
    console.print(
        f"[bold]scalpel doctor[/bold]: running {name} for {window}"
        + (" (+ overfit-one-batch check)" if options.sanity else "")
    )
    total = None if planned is None else options.warmup + planned
    # grows past the planned count, never "33 of 32"; its time left never exceeds what the cap leaves
    with StepProgress(total, f"doctor {name}", time_cap_s=options.time_cap_s) as bar:
        result = stage.run(options, progress=bar.update)
    _print_script_run(result, console)
    return result.exit_code


def _print_script_run(result: DoctorResult, console: Console) -> None:
    """The run's status, its findings (or, for one rank of ``--nproc``, where they are), the record, the
    patch and the next command."""
    from rich.markup import escape

    import torchscalpel.report.doctor_terminal as doctor_terminal
    from torchscalpel.console import say_command
    from torchscalpel.report.profile_terminal import strip_ansi
    from torchscalpel.runtime.run_notes import how_it_stopped

    record, out_dir = result.record, result.out_dir
    assert record is not None and out_dir is not None
    measured = len(record.measured_steps)
    status = (f"{how_it_stopped(record)} ({len(record.steps) - measured} warm-up + {measured} measured)") + (
        f": {strip_ansi(record.error)}" if record.error else ""
    )
    capped = record.sections["doctor"].get("window", {}).get("capped")
    if capped:
        status += f"\nwindow shortened: {capped}"
    if result.merged_rank:  # doctor --nproc prints the merged list once, not per rank
        console.print(
            f"[dim]{escape(status)}; {len(result.findings)} finding(s) in {out_dir / 'run.json'}[/dim]"
        )
    else:
        doctor_terminal.render(result.findings, console, header=f"[dim]{escape(status)}[/dim]\n")
    console.print(f"[dim]record: {out_dir / 'run.json'}[/dim]")
    for line in result.patch_lines:
        console.print(escape(line), soft_wrap=True)
    if result.next_step is not None:
        step = result.next_step
        say_command(console, step.lead, step.command, *([step.tail] if step.tail else []))

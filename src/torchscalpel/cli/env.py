"""``scalpel env``: the CUDA / driver / torch compatibility check and environment report.

Exit codes: 0 whatever was found (like ``doctor``), unless ``--fail-on LEVEL`` is given and a
finding reaches LEVEL (then 1); 2 for a usage error; 130 when interrupted (the JSON, if asked
for, is still written with the probes finished so far).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.findings import Severity
from torchscalpel.units import duration_type, int_type


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``env`` sub-command."""
    from torchscalpel.envcheck.probes import PROBES

    p = subparsers.add_parser(
        "env",
        help="check CUDA / driver / torch / compiler / backend compatibility, with quick probes",
        description="Report the environment (Python, CPU, torch build, GPUs, driver, compilers, backends, "
        "variables), check it for known incompatibilities, and run quick probes.",
    )
    p.add_argument(
        "--no-probe",
        action="store_true",
        help="skip the probes (facts and checks only: about as long as importing torch)",
    )
    p.add_argument(
        "--probe", metavar="LIST", help=f"comma-separated probes to run (default all: {','.join(PROBES)})"
    )
    p.add_argument(
        "--probe-timeout",
        type=duration_type("--probe-timeout"),
        default=60.0,
        metavar="DURATION",
        help="time each probe may take: 60s, 2m; a bare number is seconds (default 60)",
    )
    p.add_argument(
        "--compile-timeout",
        type=duration_type("--compile-timeout"),
        default=180.0,
        metavar="DURATION",
        help="time the torch.compile probe may take (default 180 s; a cold CPU compile takes 15-25 s)",
    )
    p.add_argument(
        "--nproc-per-node",
        type=int_type("--nproc-per-node", minimum=1),
        metavar="N",
        help="ranks you will run on this machine, for the thread-oversubscription check "
        "(default LOCAL_WORLD_SIZE or 1)",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        type=Path,
        metavar="FILE",
        help="also write the report as JSON here (- for standard output)",
    )
    p.add_argument(
        "--fail-on", metavar="LEVEL", help="exit 1 when a finding reaches LEVEL (info, warning, error)"
    )
    p.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> tuple[list[str], Severity | None]:
    from torchscalpel.envcheck.probes import PROBES

    if args.no_probe and args.probe is not None:
        raise UsageError("--no-probe and --probe contradict each other; use one of them.")
    text = ",".join(PROBES) if args.probe is None else args.probe
    probes = [] if args.no_probe else [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise UsageError(f"Unknown probe {unknown[0]!r} in --probe; choose from {', '.join(PROBES)}.")
    if not args.no_probe and not probes:
        raise UsageError("--probe names no probe; list some (e.g. --probe matmul,lowp) or use --no-probe.")
    for flag, value in (("--probe-timeout", args.probe_timeout), ("--compile-timeout", args.compile_timeout)):
        if not value > 0:
            raise UsageError(f"{flag} must be a positive number of seconds, not {value:g}.")
    if args.nproc_per_node is not None:
        from torchscalpel.distributed.launch import MAX_NPROC  # the same bound as ``launch --nproc``

        if not 1 <= args.nproc_per_node <= MAX_NPROC:
            shown = str(args.nproc_per_node) if len(str(args.nproc_per_node)) <= 20 else "a larger number"
            raise UsageError(f"--nproc-per-node must be at least 1 and at most {MAX_NPROC}, not {shown}.")
    if args.json_path is not None:
        if args.json_path.is_dir():
            raise UsageError(
                f"--json {args.json_path} is a folder; name a file, e.g. {args.json_path / 'env.json'}."
            )
        # Checked before the probes run, so a typo does not cost the user a minute of probing.
        existing = next(
            (p for p in [args.json_path.parent, *args.json_path.parent.parents] if p.exists()), None
        )
        if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK):
            raise UsageError(f"Cannot write --json {args.json_path}: {existing} is not a writable folder.")
    fail_on = None
    if args.fail_on:
        try:
            fail_on = Severity.parse(args.fail_on)
        except ValueError:
            raise UsageError(
                f"--fail-on {args.fail_on!r} is not a level; use info, warning or error."
            ) from None
    return probes, fail_on


def run(args: argparse.Namespace) -> int:
    """Validate, gather, print, write JSON; the exit code follows ``--fail-on``."""
    probes, fail_on = _validate(args)
    from rich.console import Console

    from torchscalpel.console import make_console
    from torchscalpel.envcheck.report import build_report, write_json
    from torchscalpel.report.env_terminal import render

    console = make_console()  # piped or captured: full width, no wrapping at 80 columns
    status_console = Console(stderr=True)
    if probes and status_console.is_terminal:
        with status_console.status("running probes (--no-probe skips them)..."):
            report = build_report(
                probes=probes,
                probe_timeout=args.probe_timeout,
                compile_timeout=args.compile_timeout,
                local_ranks=args.nproc_per_node,
            )
    else:
        report = build_report(
            probes=probes,
            probe_timeout=args.probe_timeout,
            compile_timeout=args.compile_timeout,
            local_ranks=args.nproc_per_node,
        )
    render(report, console)
    if args.json_path is not None:
        try:
            write_json(report, args.json_path)
        except OSError as exc:  # the screen above already shows everything that was measured
            raise ScalpelError(f"Could not write --json {args.json_path}: {exc.strerror or exc}.") from None
        console.print(f"JSON written to {args.json_path}")
    if not report["complete"]:
        print("scalpel: interrupted", file=sys.stderr)
        return 130
    if fail_on is not None and any(Severity.parse(f["severity"]) >= fail_on for f in report["findings"]):
        return 1
    return 0

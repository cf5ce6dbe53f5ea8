"""``scalpel batch --sizes 16,32,64 [--steps 5] [--warmup 2] [--out DIR] -- SCRIPT [ARGS]``: samples/s per batch size.

Runs the script once per size with every DataLoader's batch_size set to it, names the size with the
most samples/s, and states the learning-rate scaling rule to keep (linear for SGD, square root for Adam)
without applying it. See docs/lr.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torchscalpel.cli.common import add_target_arguments, default_run_dir, resolve_target
from torchscalpel.options import usage_error
from torchscalpel.units import int_type, parse_int


def _sizes(text: str) -> tuple[int, ...]:
    """``16,32,64``: each size a whole number of at least 1 and below 2^63, by the shared number rule (a
    size past 2^63 reached the DataLoader's sampler as the script's own OverflowError traceback)."""
    parts = [x for x in text.split(",") if x.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"--sizes takes whole numbers separated by commas, got {text!r}")
    return tuple(parse_int(x, flag="--sizes", minimum=1) for x in parts)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``batch`` sub-command."""
    p = subparsers.add_parser(
        "batch",
        help="samples/s at several batch sizes, the best one, and the lr scaling rule to keep (advice)",
        description="Run the script once per batch size (every DataLoader's batch_size set to it), measure "
        "samples/s, name the best size, and state the lr scaling rule for it (linear for SGD, square root for "
        "Adam) without applying it. See docs/lr.md.",
    )
    p.add_argument("--sizes", type=_sizes, required=True, help="batch sizes to measure, e.g. 16,32,64,128")
    p.add_argument(
        "--steps", type=int_type("--steps", minimum=1), default=5, help="measured steps per size (default 5)"
    )
    p.add_argument(
        "--warmup",
        type=int_type("--warmup"),
        default=2,
        help="steps run before measuring, per size (default 2)",
    )
    p.add_argument("--out", type=Path, help="run folder (default scalpel-runs/<time>-batch-<name>/)")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    add_target_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Validate, measure every size, print the table and the advice."""
    from torchscalpel.tune.batch_finder import BatchOptions

    try:
        options = BatchOptions.from_args(args)
    except ValueError as exc:
        raise usage_error(exc) from None
    target = resolve_target(args, flags="--sizes " + ",".join(map(str, args.sizes)))
    out_dir = args.out or default_run_dir(f"batch-{target.name}")
    import torchscalpel.report.batch_terminal as batch_terminal
    from torchscalpel.sections import BatchSection
    from torchscalpel.stages.batch import run_batch

    record = run_batch(target, options, out_dir, write_report=not args.no_report)
    section = record.section(BatchSection) or BatchSection()
    from torchscalpel.console import say_lines

    # a path a line (see cli/plan.py)
    report = [] if args.no_report else [f"report: {out_dir / 'report.html'}"]
    say_lines(
        [
            f"scalpel batch: {target.name}",
            *batch_terminal.render(section),
            f"record: {out_dir / 'run.json'}",
            *report,
        ]
    )
    return 0 if section.best is not None else 1

"""``scalpel batch --sizes 16,32,64 [--steps 5] [--warmup 2] [--out DIR] -- SCRIPT [ARGS]``: samples/s per batch size.

Runs the script once per size with every DataLoader's batch_size set to it, names the size with the
most samples/s, and states the learning-rate scaling rule to keep (linear for SGD, square root for Adam)
without applying it. See docs/lr.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torchscalpel.cli.common import add_target_arguments
from torchscalpel.options import usage_error
from torchscalpel.tune.batch_finder import parse_sizes
from torchscalpel.tune.window import BATCH_STEPS, BATCH_WARMUP
from torchscalpel.units import int_type


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``batch`` sub-command."""
    p = subparsers.add_parser(
        "batch",
        help="samples/s at several batch sizes, the best one, and the lr scaling rule to keep (advice)",
        description="Run the script once per batch size (every DataLoader's batch_size set to it), measure "
        "samples/s, name the best size, and state the lr scaling rule for it (linear for SGD, square root for "
        "Adam) without applying it. See docs/lr.md.",
    )
    p.add_argument(
        "--sizes", type=parse_sizes, required=True, help="batch sizes to measure, e.g. 16,32,64,128"
    )
    p.add_argument(
        "--steps",
        type=int_type("--steps", minimum=1),
        default=BATCH_STEPS,
        help=f"measured steps per size (default {BATCH_STEPS})",
    )
    p.add_argument(
        "--warmup",
        type=int_type("--warmup"),
        default=BATCH_WARMUP,
        help=f"steps run before measuring, per size (default {BATCH_WARMUP})",
    )
    p.add_argument("--out", type=Path, help="run folder (default scalpel-runs/<time>-batch-<name>/)")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    add_target_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Flags -> :class:`BatchOptions` -> :func:`torchscalpel.stages.batch.run` -> the table and the advice."""
    import torchscalpel.report.batch_terminal as batch_terminal
    from torchscalpel.console import say_lines
    from torchscalpel.stages import batch as stage
    from torchscalpel.tune.batch_finder import BatchOptions

    try:
        options = BatchOptions.from_args(args)
    except ValueError as exc:
        raise usage_error(exc) from None
    assert options.target is not None  # from_args resolved it
    result = stage.run(options)
    out_dir = result.out_dir
    # a path a line (see cli/plan.py)
    report = [f"report: {out_dir / 'report.html'}"] if options.report else []
    say_lines(
        [
            f"scalpel batch: {options.target.name}",
            *batch_terminal.render(result.section),
            f"record: {out_dir / 'run.json'}",
            *report,
        ]
    )
    return result.exit_code

"""``scalpel lr [--min 1e-7] [--max 10] [--steps 100] [--out DIR] -- SCRIPT [ARGS]``: the learning-rate range test.

Runs the script with every param group's learning rate swept exponentially from --min to --max over
--steps optimizer steps (the script's LR scheduler suspended), smooths the loss, stops when it
diverges, and suggests the lr at the steepest descent, only from a sweep that reached --max or diverged (a
shorter one says how far it got and how to give it the steps). A separate run the user discards. See docs/lr.md.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from torchscalpel.cli.common import add_target_arguments
from torchscalpel.lrfind.options import DEFAULT_MAX_LR, DEFAULT_MIN_LR, DEFAULT_STEPS
from torchscalpel.options import STEP_TIMEOUT_S, usage_error
from torchscalpel.runtime.window import STEP_KINDS
from torchscalpel.units import duration_type, int_type


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``lr`` sub-command."""
    p = subparsers.add_parser(
        "lr",
        help="learning-rate range test: the lr at the steepest loss descent, and where the loss diverges",
        description="Run the script with every param group's learning rate swept exponentially from --min to "
        "--max, one value per optimizer step (its own LR scheduler suspended); smooth the loss, stop when it "
        "exceeds 4x its minimum, and suggest the lr where it falls fastest (only when the sweep reached --max or "
        "diverged: a script that ends first gets how far it got instead). A separate run: discard its weights "
        "and checkpoints. See docs/lr.md.",
    )
    p.add_argument(
        "--min",
        dest="min_lr",
        type=float,
        default=DEFAULT_MIN_LR,
        help=f"first lr (default {DEFAULT_MIN_LR:g})",
    )
    p.add_argument(
        "--max",
        dest="max_lr",
        type=float,
        default=DEFAULT_MAX_LR,
        help=f"last lr (default {DEFAULT_MAX_LR:g})",
    )
    p.add_argument(
        "--steps",
        type=int_type("--steps", minimum=1),
        default=DEFAULT_STEPS,
        help=f"optimizer steps in the sweep (default {DEFAULT_STEPS})",
    )
    p.add_argument(
        "--step-kind",
        choices=STEP_KINDS,
        default="auto",
        help="what ends a step: auto (optimizer steps) or one fixed kind (default auto)",
    )
    p.add_argument(
        "--step-timeout",
        type=duration_type("--step-timeout"),
        default=STEP_TIMEOUT_S,
        metavar="DURATION",
        help=f"stop the script when no step is recognised this long after the start (default {STEP_TIMEOUT_S:.0f})",
    )
    p.add_argument("--out", type=Path, help="run folder (default scalpel-runs/<time>-lr-<name>/)")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    add_target_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Flags -> :class:`LrOptions` -> :func:`torchscalpel.stages.lr.run` -> the suggestion (or why there is
    none) and the script's exit code."""
    import torchscalpel.report.lr_terminal as lr_terminal
    from torchscalpel.console import StepProgress, say_lines
    from torchscalpel.lrfind.options import LrOptions
    from torchscalpel.report.lr_terminal import next_line
    from torchscalpel.runtime.run_notes import how_it_stopped
    from torchscalpel.stages import lr as stage

    try:
        options = LrOptions.from_args(args)
    except ValueError as exc:
        raise usage_error(exc) from None
    assert options.target is not None  # from_args resolved it
    target = options.target
    with StepProgress(options.steps, f"sweeping the learning rate of {target.name}") as bar:
        result = stage.run(options, progress=bar.update)
    record, out_dir = result.record, result.out_dir
    say_lines(
        [
            f"scalpel lr: {target.name}: {how_it_stopped(record)}"
            + (f" ({record.error})" if record.error else ""),
            *lr_terminal.render(result.section),
            f"record: {out_dir / 'run.json'}",  # a path a line (see cli/plan.py)
            *([] if not options.report else [f"report: {out_dir / 'report.html'}"]),
            next_line(result.section, ("" if target.script else "-m ") + shlex.join(target.argv())),
        ]
    )
    return result.exit_code

"""``scalpel plan``: per-rank memory for each parallel strategy, fits / max batch, recommendation.

Factory mode: ``scalpel plan --model MODULE:FACTORY --batch SPEC [options]``.
Script mode: ``scalpel plan [options] -- SCRIPT [ARGS]`` (model, optimizer and batch taken from the
script's first step). See docs/plan.md.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchscalpel.cli.common import (
    add_output_arguments,
    add_target_arguments,
)
from torchscalpel.plan.names import OPTIMIZERS, PRECISIONS, STRATEGIES
from torchscalpel.units import int_type

if TYPE_CHECKING:
    from torchscalpel.plan.result import PlanResult


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plan`` sub-command."""
    p = subparsers.add_parser(
        "plan",
        help="per-rank memory plan (params, grads, optimizer, activations, buffers) per strategy",
        description="Plan per-rank memory for each parallel strategy without allocating real memory.",
    )
    p.add_argument(
        "--model", metavar="MODULE:FACTORY", help="factory returning the nn.Module (MODULE may be a .py path)"
    )
    p.add_argument("--factory-args", metavar="JSON", help="keyword arguments for the factory, a JSON object")
    p.add_argument(
        "--batch", metavar="SPEC", help="per-rank batch, e.g. 'x=float32[8,3,32,32],y=int64[8]:10'"
    )
    p.add_argument("--loss", metavar="MODULE:FN", help="loss function FN(model, batch) -> scalar tensor")
    p.add_argument(
        "--optimizer",
        default=None,
        choices=list(OPTIMIZERS),
        help="optimizer (default: adamw with --model; with a script, the one the script built, or none)",
    )
    p.add_argument(
        "--precision", default="fp32", choices=list(PRECISIONS), help="numeric precision (default fp32)"
    )
    p.add_argument(
        "--strategy", default="all", choices=[*STRATEGIES, "all"], help="strategy to plan (default all)"
    )
    p.add_argument(
        "--world-size", type=int_type("--world-size", minimum=1), default=1, help="total ranks (default 1)"
    )
    p.add_argument(
        "--nodes",
        type=int_type("--nodes", minimum=1),
        default=1,
        help="nodes the ranks span (for fsdp-hybrid; default 1)",
    )
    p.add_argument(
        "--activation-checkpointing",
        default="none",
        choices=["none", "blocks"],
        help="block-level activation checkpointing assumed by the rows (default none)",
    )
    p.add_argument(
        "--grad-accum",
        type=int_type("--grad-accum", minimum=1),
        default=1,
        help="gradient accumulation micro-steps (default 1)",
    )
    p.add_argument(
        "--device", metavar="NAME", help="target device from the table (e.g. A100-80GB, H100-80GB, L4, cpu)"
    )
    p.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="target device memory, e.g. 80GiB (2^30 bytes each) or 40GB (10^9 each); a bare number is bytes",
    )
    p.add_argument("--no-max-batch", action="store_true", help="skip the largest-batch search (faster)")
    add_output_arguments(p)
    add_target_arguments(p, required=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Flags to :class:`~torchscalpel.plan.options.PlanOptions`, then the plan stage; the exit code."""
    from torchscalpel.options import usage_error
    from torchscalpel.plan.options import PlanOptions
    from torchscalpel.stages import plan as stage

    try:
        options = PlanOptions.from_args(args, quiet=False)
    except ValueError as exc:
        raise usage_error(exc) from None
    result = stage.run(options)
    _print_table(result)
    if options.out_dir is not None:
        # one path a line: a path may run past an 80-column edge (a terminal copies it whole), prose between two may not
        print(f"plan written to\n  {options.out_dir}/run.json\n  {options.out_dir}/report.html")
    return 0


def _print_table(result: PlanResult) -> None:
    """The plan's table at the console's width, its long lines folded with a hanging indent."""
    import torchscalpel.report.plan_terminal as plan_terminal
    from torchscalpel.console import make_console, say

    out = make_console(highlight=False)
    for line in plan_terminal.render(result, width=None if out.soft_wrap else out.width).splitlines():
        say(out, line, hang=2, sep=" · ")

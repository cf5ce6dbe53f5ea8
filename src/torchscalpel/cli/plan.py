"""``scalpel plan``: per-rank memory for each parallel strategy, fits / max batch, recommendation.

Factory mode: ``scalpel plan --model MODULE:FACTORY --batch SPEC [options]``.
Script mode: ``scalpel plan [options] -- SCRIPT [ARGS]`` (model, optimizer and batch taken from the
script's first step). See docs/plan.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from torchscalpel.cli.common import (
    add_output_arguments,
    add_target_arguments,
    default_run_dir,
    resolve_target,
)
from torchscalpel.errors import UsageError
from torchscalpel.fileio import write_output_text
from torchscalpel.plan.names import OPTIMIZERS, PRECISIONS, STRATEGIES
from torchscalpel.units import int_type


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
    """Validate, plan, print, write run.json / report.html / --json."""
    _validate(args)
    from torchscalpel.plan.devices import resolve_device
    from torchscalpel.plan.strategies import strategies_for

    device = resolve_device(args.device, args.device_memory)
    strategies = strategies_for(args.strategy, args.world_size, args.nodes)
    script_mode = _script_mode(args)
    from torchscalpel.console import TerminalProgress, say

    # a large model's simulation and max-batch search take minutes: "N of M" strategies, on a terminal only
    info = "simulating on fake tensors" + (
        "" if args.no_max_batch else " + largest-batch search (--no-max-batch skips it)"
    )
    with TerminalProgress("plan", len(strategies), info) as bar:
        # piped (a CI log) the bar is not drawn: a plain line a strategy instead, none before the
        # first (a bad --model or --batch stays a one-line error)
        def progress(done: int, total: int, what: str) -> None:
            # the total grows when nothing fits and checkpointed rows follow
            bar.show(completed=done, total=max(done, total), info=f"{what} done")
            if not bar.enabled:
                say(bar.console, f"plan: {done} of {max(done, total)}: {what} done")

        def note(text: str) -> None:
            if not bar.enabled:  # on a terminal the bar says it; a second console's line would break it
                say(bar.console, text)

        result, record, out_dir = _plan(args, device, strategies, script_mode, progress, note)
    import torchscalpel.report.plan_terminal as plan_terminal
    from torchscalpel.console import make_console
    from torchscalpel.sections import PlanSection

    out = make_console(highlight=False)
    for line in plan_terminal.render(result, width=None if out.soft_wrap else out.width).splitlines():
        say(out, line, hang=2, sep=" · ")
    record.sections[PlanSection.KEY] = result.to_dict()
    _write_outputs(args, record, out_dir, result.to_dict())
    return 0


def _plan(
    args: argparse.Namespace,
    device,
    strategies,
    script_mode: bool,
    progress: Callable[[int, int, str], None],
    note: Callable[[str], None],
):
    if script_mode:
        from torchscalpel.options import usage_error
        from torchscalpel.plan.script import ScriptPlanOptions, plan_script

        target = resolve_target(args)
        out_dir = Path(args.out or default_run_dir(f"plan-{target.name}"))
        try:
            options = ScriptPlanOptions.from_args(args)
        except ValueError as exc:
            raise usage_error(exc) from None
        # the script runs to its first optimizer step before any strategy is simulated: say so in a
        # pipe, or the first seconds show nothing
        note(f"plan: running {target.name} to its first optimizer step ...")
        result, record = plan_script(target, options, device, strategies, progress=progress)
    else:
        result = _factory_plan(args, device, strategies, progress)
        record, out_dir = _factory_record(args, result)
    return result, record, out_dir


def _script_mode(args: argparse.Namespace) -> bool:
    """A script (or -m module) was given after --, rather than --model/--batch."""
    return bool(args.module or [a for a in (args.target or []) if a != "--"])


def _validate(args: argparse.Namespace) -> None:
    if args.world_size < 1:
        raise UsageError(f"--world-size {args.world_size} must be at least 1.")
    if args.nodes < 1 or args.world_size % args.nodes:
        raise UsageError(
            f"--nodes {args.nodes} must be at least 1 and divide --world-size {args.world_size}."
        )
    if args.grad_accum < 1:
        raise UsageError(f"--grad-accum {args.grad_accum} must be at least 1.")
    if args.strategy == "fsdp-hybrid" and args.nodes < 2:
        raise UsageError(
            "--strategy fsdp-hybrid shards within a node and replicates across nodes; give --nodes 2 or more."
        )
    if args.strategy in ("ddp", "fsdp-full", "fsdp-grad-op") and args.world_size < 2:
        raise UsageError(
            f"--strategy {args.strategy} needs --world-size 2 or more; use --strategy single for one rank."
        )
    script = _script_mode(args)
    if script and (args.model or args.batch):
        raise UsageError("Give either --model/--batch (factory mode) or a script after --, not both.")
    if not script and not args.model:
        raise UsageError(
            "Name the script after --, e.g. 'scalpel plan -- train.py', or the model with --model "
            "MODULE:FACTORY and --batch SPEC."
        )
    if not script and not args.batch:
        raise UsageError("Factory mode needs --batch, e.g. --batch 'x=float32[8,3,32,32],y=int64[8]:10'.")


def _factory_plan(
    args: argparse.Namespace, device, strategies, progress: Callable[[int, int, str], None] | None = None
):
    from torchscalpel.loading import load_callable
    from torchscalpel.plan.planner import PlanRequest, make_plan
    from torchscalpel.plan.simulate import OptimizerSpec, sim_settings_for
    from torchscalpel.plan.spec import parse_batch_spec, parse_factory_args

    batch = parse_batch_spec(args.batch)
    kwargs = parse_factory_args(args.factory_args)
    factory = load_callable(args.model, flag="--model")
    loss_fn = load_callable(args.loss, flag="--loss") if args.loss else None
    request = PlanRequest(
        builder=lambda: factory(**kwargs),
        batch=batch,
        loss_fn=loss_fn,
        strategies=strategies,
        world_size=args.world_size,
        nodes=args.nodes,
        device=device,
        checkpointing=args.activation_checkpointing,
        search_max_batch=not args.no_max_batch,
        model_name=args.model,
        progress=progress,
        settings=sim_settings_for(
            OptimizerSpec.named(args.optimizer or "adamw"), args.precision, args.grad_accum, device
        ),
    )
    return make_plan(request)


def _factory_record(args: argparse.Namespace, result):
    from torchscalpel.envcheck.facts import collect_facts
    from torchscalpel.record import new_run_record

    name = args.model.rsplit(":", 1)[-1]
    try:
        env = collect_facts()
    except Exception:  # facts are nice to have; a plan must not fail for them
        env = {}
    record = new_run_record(
        f"plan-{name}",
        command=["scalpel", *sys.argv[1:]],
        status="complete",
        environment=env,
        target={"model": args.model, "factory_args": args.factory_args},
    )
    return record, args.out or default_run_dir(f"plan-{name}")


def _write_outputs(args: argparse.Namespace, record, out_dir: Path, plan: dict) -> None:
    from torchscalpel.stages.saving import save_with_report

    out_dir = Path(out_dir)
    save_with_report(record, out_dir)  # run.json first: a report that fails to render loses nothing
    if args.json_path:
        write_output_text(args.json_path, json.dumps(plan, indent=1) + "\n", flag="--json")
    # one path a line: a path may run past an 80-column edge (a terminal copies it whole), prose between two may not
    print(f"plan written to\n  {out_dir}/run.json\n  {out_dir}/report.html")

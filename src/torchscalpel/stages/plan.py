"""The plan stage: resolve the device and strategies, plan the script's or the factory's model on fake tensors,
save run.json first and then report.html (:func:`~torchscalpel.stages.saving.save_with_report`).

``scalpel plan`` and ``torchscalpel.plan`` both end here with one :class:`~torchscalpel.plan.options.PlanOptions`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torchscalpel.plan.options import PlanOptions
from torchscalpel.plan.result import PlanResult
from torchscalpel.record import RunRecord
from torchscalpel.stages.saving import save_with_report

Progress = Callable[[int, int, str], None]
"""``(rows done, rows planned, what was done)`` after each strategy's row."""


def run(options: PlanOptions, *, progress: Progress | None = None) -> PlanResult:
    """Plan what ``options`` names; save as they ask (nothing is printed: ``report/plan_terminal.render`` draws
    the table). Returns the plan (``.rows``, ``.to_dict()``).

    ``progress`` is called after each strategy's row; without it, a CLI run (``quiet`` off) draws its own bar
    on a terminal and one line a strategy in a pipe."""
    from torchscalpel.plan.devices import resolve_device
    from torchscalpel.plan.strategies import strategies_for
    from torchscalpel.sections import PlanSection

    device = resolve_device(options.device, options.device_memory)
    strategies = strategies_for(options.strategy, options.world_size, options.nodes)
    record: RunRecord | None
    with _reporting(options, len(strategies), progress) as (report, note):
        if options.target is not None:
            from torchscalpel.plan.script import plan_script

            # the script runs to its first optimizer step before any strategy is simulated: say so in a
            # pipe, or the first seconds show nothing
            note(f"plan: running {options.target.name} to its first optimizer step ...")
            result, record = plan_script(options, device, strategies, progress=report)
        else:
            result = _factory_plan(options, device, strategies, report)
            # a factory ran nothing: its record is written only where it is saved (collecting the
            # environment's facts takes a moment a notebook need not pay)
            record = _factory_record(options) if options.out_dir is not None else None
    if record is not None:
        record.sections[PlanSection.KEY] = result.to_dict()
    if options.out_dir is not None and record is not None:
        save_with_report(
            record, options.out_dir
        )  # run.json first: a report that fails to render loses nothing
    if options.json_path is not None:
        from torchscalpel.fileio import write_output_text

        write_output_text(options.json_path, json.dumps(result.to_dict(), indent=1) + "\n", flag="--json")
    return result


@contextmanager
def _reporting(
    options: PlanOptions, strategies: int, progress: Progress | None
) -> Iterator[tuple[Progress | None, Callable[[str], None]]]:
    """(row callback, note): the caller's callback, or on the CLI a bar ("N of M" strategies) on a terminal and
    a plain line a strategy in a pipe, none before the first (a bad --model or --batch stays a one-line error)."""
    if options.quiet or progress is not None:
        yield progress, lambda text: None
        return
    from torchscalpel.console import TerminalProgress, say

    # a large model's simulation and max-batch search take minutes
    info = "simulating on fake tensors" + (
        " + largest-batch search (--no-max-batch skips it)" if options.search_max_batch else ""
    )
    with TerminalProgress("plan", strategies, info) as bar:

        def row_done(done: int, total: int, what: str) -> None:
            # the total grows when nothing fits and checkpointed rows follow
            bar.show(completed=done, total=max(done, total), info=f"{what} done")
            if not bar.enabled:
                say(bar.console, f"plan: {done} of {max(done, total)}: {what} done")

        def note(text: str) -> None:
            if not bar.enabled:  # on a terminal the bar says it; a second console's line would break it
                say(bar.console, text)

        yield row_done, note


def _factory_plan(
    options: PlanOptions, device: Any, strategies: list[str], progress: Progress | None
) -> PlanResult:
    from torchscalpel.loading import load_callable
    from torchscalpel.plan.planner import PlanRequest, make_plan
    from torchscalpel.plan.simulate import OptimizerSpec, sim_settings_for
    from torchscalpel.plan.spec import parse_batch_spec, parse_factory_args

    assert options.batch is not None and options.model is not None  # PlanOptions checked factory mode
    batch = parse_batch_spec(options.batch)
    kwargs = parse_factory_args(options.factory_args)
    factory = (
        load_callable(options.model, flag="--model") if isinstance(options.model, str) else options.model
    )
    loss = options.loss
    loss_fn = load_callable(loss, flag="--loss") if isinstance(loss, str) else loss
    request = PlanRequest(
        builder=lambda: factory(**kwargs),
        batch=batch,
        loss_fn=loss_fn,
        strategies=strategies,
        world_size=options.world_size,
        nodes=options.nodes,
        device=device,
        checkpointing=options.checkpointing,
        search_max_batch=options.search_max_batch,
        model_name=options.model_name,
        progress=progress,
        settings=sim_settings_for(
            OptimizerSpec.named(options.optimizer or "adamw"), options.precision, options.grad_accum, device
        ),
    )
    return make_plan(request)


def _factory_record(options: PlanOptions) -> RunRecord:
    from torchscalpel.envcheck.facts import collect_facts
    from torchscalpel.record import new_run_record

    try:
        env = collect_facts()
    except Exception:  # facts are nice to have; a plan must not fail for them
        env = {}
    return new_run_record(
        f"plan-{options.name}",
        command=["scalpel", *sys.argv[1:]],
        status="complete",
        environment=env,
        target={"model": options.model_name, "factory_args": options.factory_args},
    )

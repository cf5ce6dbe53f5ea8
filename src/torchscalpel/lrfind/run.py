"""One range test: the script run under the sweep observer; its record returned (saving is the stage's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torchscalpel.lrfind.observer import LrSweepObserver
from torchscalpel.lrfind.options import LrOptions
from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.runtime.session import RuntimeOptions, run_target
from torchscalpel.runtime.target import Target


def find_lr(
    target: Target,
    options: LrOptions,
    *,
    progress: Callable[[StepRecord], None] | None = None,
    command: Sequence[str] = (),
) -> RunRecord:
    """Run ``target`` for ``options.steps`` optimizer steps with the lr swept; ``sections["lr"]`` holds the result.

    No warm-up (every step is a point of the sweep), no profiler window, no step scalars: the run
    measures the loss against the learning rate and nothing else. Raises ``ValueError`` for a step
    kind or time limit the runtime refuses.
    """
    observer = LrSweepObserver(options)
    runtime = RuntimeOptions(
        warmup=0,
        steps=options.steps,
        out_dir=options.out_dir,
        profile_steps=0,
        name=options.name,
        step_kind=options.step_kind,
        step_timeout_s=options.step_timeout_s,
        step_scalars=False,  # the observer records the lr it set; nothing is exported
    )
    return run_target(
        target,
        runtime,
        observers=[observer],
        setup_hooks=[observer.setup],
        progress=progress,
        command=command,
    )

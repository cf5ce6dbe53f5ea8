"""One range test: the script run under the sweep observer; its record returned (saving is the stage's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torchscalpel.lrfind.coverage import step_flags
from torchscalpel.lrfind.observer import LrSweepObserver
from torchscalpel.lrfind.options import LrOptions
from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.runtime.session import RuntimeOptions, run_target
from torchscalpel.runtime.target import Target

MAX_SCRIPT_BYTES = 8 << 20
"""Scripts larger than this are not read for their arguments (no hand-written script comes close)."""


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
    observer = LrSweepObserver(options, step_flags=_script_step_flags(target))
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


def _script_step_flags(target: Target) -> list[str]:
    """The script's own arguments that make it train longer (``--epochs``), read from its source (PEP 263
    encoding), for the advice when the sweep is short; [] for a module or a file that cannot be read."""
    import tokenize

    script = target.script
    if script is None:
        return []
    path = script / "__main__.py" if script.is_dir() else script
    try:
        if path.stat().st_size > MAX_SCRIPT_BYTES:
            return []
        with tokenize.open(path) as fh:
            return step_flags(fh.read())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return []

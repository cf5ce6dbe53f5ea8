"""``scalpel profile [options] -- SCRIPT [ARGS]``: split every step of an unmodified script into phases.

Writes ``run.json`` (the Run record), ``report.html`` and ``trace.json.gz`` into the run folder,
also when the script fails or is interrupted; exits with the script's own code in that case.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torchscalpel.cli.common import (
    add_output_arguments,
    add_target_arguments,
    add_tracking_arguments,
    add_window_arguments,
)
from torchscalpel.options import usage_error
from torchscalpel.runtime.profile_options import DEFAULT_EXAMPLE, ProfileOptions
from torchscalpel.runtime.window import PROFILE_WINDOW
from torchscalpel.units import int_type


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``profile`` sub-command."""
    p = subparsers.add_parser(
        "profile",
        help="time every step of a script: data / forward / backward / optimizer / other",
        description="Run a training script unmodified and split every step into data wait, forward, "
        "backward, optimizer and other, with top ops, memory, FLOP/s, a trace and an HTML report. "
        f"Without a script, profiles examples/{DEFAULT_EXAMPLE}.",
    )
    add_runtime_arguments(p)
    add_output_arguments(p)
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="apply the [tune] settings of this scalpel.toml while profiling, as 'scalpel run' does",
    )
    add_tracking_arguments(p)
    add_target_arguments(p, required=False)
    p.set_defaults(func=run)
    return p


PROFILE_STEPS = PROFILE_WINDOW.steps
"""What ``--steps auto`` measures in profile."""


def add_runtime_arguments(p: argparse.ArgumentParser) -> None:
    """The run window plus ``--profile-steps`` and ``--module-times``."""
    add_window_arguments(
        p, warmup=PROFILE_WINDOW.warmup, steps=str(PROFILE_STEPS), steps_help=f"{PROFILE_STEPS}"
    )
    p.add_argument(
        "--profile-steps",
        type=int_type("--profile-steps"),
        default=PROFILE_WINDOW.profile_steps,
        help=f"steps inside the torch.profiler window; 0 disables (default {PROFILE_WINDOW.profile_steps})",
    )
    p.add_argument(
        "--profile-budget",
        type=int_type("--profile-budget", minimum=1),
        default=PROFILE_WINDOW.profile_event_budget,
        metavar="EVENTS",
        help="trace events the profiler window may hold; beyond it the window covers fewer steps, "
        f"drops shapes and memory, or cuts its step short, and says so (default {PROFILE_WINDOW.profile_event_budget})",
    )
    p.add_argument("--module-times", action="store_true", help="also time each submodule's forward")
    p.add_argument(
        "--no-op-lines",
        action="store_true",
        help="skip the op-line pass: the one step after the profiler window that names each top op's "
        "user line and shapes and finds op patterns with a known fix",
    )
    p.add_argument(
        "--with-stack",
        action="store_true",
        help="record torch's Python stacks in the profiler window too (torch.profiler's with_stack: "
        "the full trace the torch way, larger and slower)",
    )
    p.add_argument(
        "--record-shapes",
        action="store_true",
        help="keep input shapes in the profiler window even where --profile-budget would drop them",
    )


def run(args: argparse.Namespace) -> int:
    """Flags -> :class:`ProfileOptions` -> :func:`torchscalpel.stages.profile.run` -> the summary and the
    script's exit code."""
    import torchscalpel.report.profile_terminal as profile_terminal
    from torchscalpel.console import StepProgress
    from torchscalpel.stages import profile as stage

    try:
        options = ProfileOptions.from_args(args)
    except ValueError as exc:
        raise usage_error(exc) from None
    assert options.target is not None  # from_args resolved it (the bundled example without a script)
    total = options.warmup + options.steps if options.steps is not None else None
    with StepProgress(total, f"profiling {options.target.name}") as bar:
        result = stage.run(options, progress=bar.update)
    profile_terminal.render(result.record, result.out_dir)  # also when the --json copy could not be written
    if result.json_error is not None:
        raise result.json_error
    return result.exit_code

"""Arguments and validation shared by the commands that run a user's script.

Every such command takes ``[options] -- SCRIPT [ARGS]`` or ``[options] -m MODULE [ARGS]``;
script arguments pass through untouched (argparse never sees them).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import cast

from torchscalpel import fileio
from torchscalpel.errors import UsageError
from torchscalpel.options import STEP_TIMEOUT_S, usage_error
from torchscalpel.runtime.target import Target, target_from_args
from torchscalpel.runtime.window import STEP_KINDS, StepCount, check_warmup, parse_steps
from torchscalpel.units import duration_type, int_type

__all__ = [
    "Target",
    "add_output_arguments",
    "add_target_arguments",
    "add_tracking_arguments",
    "add_window_arguments",
    "default_run_dir",
    "execute_tracked",
    "resolve_target",
    "steps_arg",
    "track",
]


RUNS_ROOT: Path | None = None
"""The config file's ``out_root`` for this invocation (set by ``cli.main``); None: ``scalpel-runs``."""


def default_run_dir(name: str, root: Path | None = None) -> Path:
    """``<root>/<time>-<name>/``: root is ``root``, else the config file's ``out_root``, else scalpel-runs."""
    return fileio.default_run_dir(name, root or RUNS_ROOT)


def add_target_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Add ``-m MODULE`` and the trailing ``SCRIPT [ARGS]`` to ``parser``."""
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m does")
    parser.add_argument(
        "target",
        nargs=argparse.REMAINDER,
        metavar="-- SCRIPT [ARGS]",
        help="the training script and its own arguments (after --)" + ("" if required else "; optional"),
    )


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--out DIR`` and ``--json FILE``."""
    parser.add_argument("--out", type=Path, help="output folder (default scalpel-runs/<time>-<name>/)")
    parser.add_argument(
        "--json",
        dest="json_path",
        type=Path,
        metavar="FILE",
        help="also write the JSON result here (- for standard output)",
    )


def resolve_target(
    args: argparse.Namespace, *, default_script: Path | None = None, flags: str = ""
) -> Target:
    """Validate the script or module the user named (:func:`torchscalpel.runtime.target.target_from_args`)."""
    return target_from_args(args, default_script=default_script, flags=flags)


def add_window_arguments(
    parser: argparse.ArgumentParser, *, warmup: int, steps: str, steps_help: str
) -> None:
    """``--warmup``, ``--steps N|all|auto``, ``--step-kind``, ``--step-timeout``: the run window of every
    script-running command, one grammar (see :mod:`torchscalpel.runtime.window`)."""
    parser.add_argument(
        "--warmup",
        type=int_type("--warmup"),
        default=warmup,
        help=f"steps run before measuring (default {warmup})",
    )
    parser.add_argument(
        "--steps",
        default=steps,
        help=f"measured steps: a number, 'all' (until the script ends) or "
        f"'auto' ({steps_help}; default {steps})",
    )
    parser.add_argument(
        "--step-kind",
        choices=STEP_KINDS,
        default="auto",
        help="what ends a step: auto (optimizer steps when there are any, else backward calls, "
        "else forward calls) or one fixed kind (default auto)",
    )
    parser.add_argument(
        "--step-timeout",
        type=duration_type("--step-timeout"),
        default=STEP_TIMEOUT_S,
        metavar="DURATION",
        help="stop the script when no step is recognised this long after the "
        f"start: 90s, 10m; a bare number is seconds (default {STEP_TIMEOUT_S:.0f})",
    )


def steps_arg(args: argparse.Namespace, *, minimum: int = 1) -> StepCount:
    """The parsed ``--steps`` (and a valid ``--warmup``), as a :class:`UsageError` with one sentence when not."""
    try:
        check_warmup(args.warmup)
        return parse_steps(args.steps, minimum=minimum)
    except ValueError as exc:
        raise usage_error(exc) from None


# Commands whose --out is a folder (report's --out is an HTML file; launch and serve validate their own).
OUT_DIR_COMMANDS = ("profile", "demo", "doctor", "tune", "run", "plan", "export")


def check_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, output paths that cannot be written and input files that are folders:
    ``--out`` under /proc or onto an existing file, ``--json`` / ``--sarif`` / ``--html`` / ``--patch`` naming a folder
    or an unwritable place, ``--config`` naming a folder. One :class:`UsageError` sentence each."""
    command = getattr(args, "command", None)
    out = getattr(args, "out", None)
    if command in OUT_DIR_COMMANDS and isinstance(out, Path):
        fileio.check_output_dir(out)
    for attr, flag in (
        ("json_path", "--json"),
        ("sarif", "--sarif"),
        ("html_path", "--html"),
        ("patch", "--patch"),  # fix's diff file (tune's --patch is a switch, not a Path)
    ):
        value = getattr(args, attr, None)
        if isinstance(value, Path):
            fileio.check_output_file(value, flag)
    tensorboard = getattr(args, "tensorboard", None)
    if isinstance(tensorboard, Path) and tensorboard.exists() and not tensorboard.is_dir():
        raise UsageError(
            f"--tensorboard {tensorboard} is a file; name a log folder (it is created if missing)."
        )
    if getattr(args, "mlflow", None) is not None:
        tracking_options(
            args
        )  # a mistyped URI (``::bad::``) is refused before the run, not made a folder after it
    config = getattr(args, "config", None)
    if isinstance(config, Path) and config.is_dir():
        raise UsageError(
            f"--config {config} is a folder; name a settings file, e.g. {config / 'scalpel.toml'}."
        )


def check_numbers(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *, minimum: float | None = None
) -> None:
    """Hold every number flag of ``parser`` to the shared number rule (:mod:`torchscalpel.units`) before
    anything starts. A flag typed with ``units.int_type`` / ``float_type`` / ``duration_type`` is checked again
    here because its value may not have come through the type: a ``scalpel.toml`` default is laid on the
    parser as a number.
    A flag parsed by a plain ``type=int`` (flags whose modules keep their own checks: fix, serve) must be
    below 2^63 in size, its least value staying its module's to check. With ``minimum`` (torchrun's own
    parser under ``launch``, whose numbers are all counts, ports and intervals) plain ``type=int`` and
    ``type=float`` flags must also be at least ``minimum``, and the floats finite; without it a plain float
    is left to its module (lr's --min/--max say why a learning rate must be finite in their own words).
    One :class:`UsageError` sentence (exit 2)."""
    from torchscalpel.units import FLOAT_LIMIT, INT_LIMIT, NumberType, parse_float, parse_int

    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if isinstance(value, bool) or not action.option_strings:
            continue
        flag = max(action.option_strings, key=len)
        typed = isinstance(action.type, NumberType) or getattr(action.type, "__name__", "") == "duration"
        if typed and isinstance(value, int | float):
            # both kinds take the number as well as its text (parse_int / parse_float / parse_duration)
            cast("Callable[[float], object]", action.type)(value)
            continue
        if action.type not in (int, float):
            continue
        for item in value if isinstance(value, list) else [value]:
            if action.type is int and isinstance(item, int):
                parse_int(str(item), flag=flag, minimum=-INT_LIMIT if minimum is None else int(minimum))
            elif action.type is float and isinstance(item, float) and minimum is not None:
                parse_float(str(item), flag=flag, minimum=-FLOAT_LIMIT if minimum is None else minimum)


def add_tracking_arguments(parser: argparse.ArgumentParser) -> None:
    """``--tensorboard DIR`` and ``--mlflow URI``: where else the finished run is written (docs/tracking.md)."""
    parser.add_argument(
        "--tensorboard",
        type=Path,
        metavar="DIR",
        help="also write per-step scalars and the trace to this TensorBoard log folder",
    )
    parser.add_argument(
        "--mlflow",
        metavar="URI",
        help="also log metrics, parameters, report and record to this MLflow tracking URI or folder",
    )


def tracking_options(args: argparse.Namespace) -> object:
    """The parsed tracking flags as :class:`~torchscalpel.tracking.TrackingOptions` (one sentence when invalid)."""
    from torchscalpel.tracking import TrackingOptions

    try:
        return TrackingOptions(
            tensorboard=getattr(args, "tensorboard", None), mlflow=getattr(args, "mlflow", None)
        )
    except ValueError as exc:
        raise UsageError(f"{exc}.") from None


def track(args: argparse.Namespace, record: object, run_dir: Path | None, **kwargs: object) -> None:
    """Write a finished run (a RunRecord, or the path of its run.json) to the trackers its command line
    asked for; nothing when none was."""
    options = tracking_options(args)
    if not options.any:  # type: ignore[attr-defined]
        return
    from torchscalpel.tracking import write_tracking

    if isinstance(record, Path):
        from torchscalpel.record import load_record

        record = load_record(record)

    write_tracking(record, run_dir, options, **kwargs)  # type: ignore[arg-type]


def execute_tracked(args: argparse.Namespace, target: Target, execute: Callable[[Target], int]) -> int:
    """``scalpel run``: ``execute(target)`` as it is, or, with ``--tensorboard`` / ``--mlflow``, the same run
    under the runtime's step timeline (no profiler, no step limit, no timeout) so that per-step scalars
    exist; its record goes to ``scalpel-runs/<time>-run-<name>/`` and to the trackers."""
    if not tracking_options(args).any:  # type: ignore[attr-defined]
        return execute(target)
    from torchscalpel.record import save_record
    from torchscalpel.runtime.session import RuntimeOptions, run_target

    options = RuntimeOptions(warmup=0, steps=None, profile_steps=0, name=target.name, step_timeout_s=None)
    record = run_target(target, options, command=["scalpel", "run", *target.argv()])
    out = default_run_dir(f"run-{target.name}")
    out.mkdir(parents=True, exist_ok=True)
    record.artifacts["record"] = "run.json"
    save_record(record, out)
    track(args, record, out)
    return record.exit_code or 0

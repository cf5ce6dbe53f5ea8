"""Arguments and validation shared by the commands that run a user's script.

Every such command takes ``[options] -- SCRIPT [ARGS]`` or ``[options] -m MODULE [ARGS]``;
script arguments pass through untouched (argparse never sees them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from torchscalpel import fileio
from torchscalpel.errors import UsageError
from torchscalpel.runtime.target import Target, resolve_script
from torchscalpel.runtime.window import STEP_KINDS, StepCount, parse_steps
from torchscalpel.units import duration_type

__all__ = ["Target", "add_output_arguments", "add_target_arguments", "add_window_arguments", "default_run_dir",
           "resolve_target", "steps_arg"]


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
    parser.add_argument("--json", dest="json_path", type=Path, metavar="FILE", help="also write the JSON result here (- for standard output)")


def resolve_target(args: argparse.Namespace, *, default_script: Path | None = None) -> Target:
    """Validate the script or module the user named; raise :class:`UsageError` with one sentence."""
    return resolve_script(list(args.target or []), getattr(args, "module", None), default_script=default_script)


def add_window_arguments(parser: argparse.ArgumentParser, *, warmup: int, steps: str, steps_help: str) -> None:
    """``--warmup``, ``--steps N|all|auto``, ``--step-kind``, ``--step-timeout``: the run window of every
    script-running command, one grammar (see :mod:`torchscalpel.runtime.window`)."""
    parser.add_argument("--warmup", type=int, default=warmup, help=f"steps run before measuring (default {warmup})")
    parser.add_argument("--steps", default=steps, help=f"measured steps: a number, 'all' (until the script ends) or "
                        f"'auto' ({steps_help}; default {steps})")
    parser.add_argument("--step-kind", choices=STEP_KINDS, default="auto",
                        help="what ends a step: auto (optimizer steps when there are any, else backward calls, "
                        "else forward calls) or one fixed kind (default auto)")
    parser.add_argument("--step-timeout", type=duration_type("--step-timeout"), default=600.0,
                        metavar="DURATION", help="stop the script when no step is recognised this long after the "
                        "start: 90s, 10m; a bare number is seconds (default 600)")


def steps_arg(args: argparse.Namespace, *, minimum: int = 1) -> StepCount:
    """The parsed ``--steps`` (and a valid ``--warmup``), as a :class:`UsageError` with one sentence when not."""
    if args.warmup < 0:
        raise UsageError("--warmup must be 0 or more.")
    try:
        return parse_steps(args.steps, minimum=minimum)
    except ValueError as exc:
        raise UsageError(f"{exc}.") from None


# Commands whose --out is a folder (report's --out is an HTML file; launch and serve validate their own).
OUT_DIR_COMMANDS = ("profile", "demo", "doctor", "tune", "run", "plan", "export")


def check_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, output paths that cannot be written and input files that are folders:
    ``--out`` under /proc or onto an existing file, ``--json`` / ``--sarif`` / ``--html`` naming a folder
    or an unwritable place, ``--config`` naming a folder. One :class:`UsageError` sentence each."""
    command = getattr(args, "command", None)
    out = getattr(args, "out", None)
    if command in OUT_DIR_COMMANDS and isinstance(out, Path):
        fileio.check_output_dir(out)
    for attr, flag in (("json_path", "--json"), ("sarif", "--sarif"), ("html_path", "--html")):
        value = getattr(args, attr, None)
        if isinstance(value, Path):
            fileio.check_output_file(value, flag)
    config = getattr(args, "config", None)
    if isinstance(config, Path) and config.is_dir():
        raise UsageError(f"--config {config} is a folder; name a settings file, e.g. {config / 'scalpel.toml'}.")


def finite_float(value: float | None, flag: str, *, minimum: float = 0.0) -> None:
    """Refuse NaN, infinities and values below ``minimum`` for a float flag (one sentence)."""
    import math

    if value is not None and (not math.isfinite(value) or value < minimum):
        raise UsageError(f"{flag} {value} must be a finite number of at least {minimum:g}.")

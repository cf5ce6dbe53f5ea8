"""Arguments and validation shared by the commands that run a user's script.

Every such command takes ``[options] -- SCRIPT [ARGS]`` or ``[options] -m MODULE [ARGS]``;
script arguments pass through untouched (argparse never sees them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from torchscalpel.fileio import default_run_dir
from torchscalpel.runtime.target import Target, resolve_script

__all__ = ["Target", "add_output_arguments", "add_target_arguments", "default_run_dir", "resolve_target"]


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
    parser.add_argument("--json", dest="json_path", type=Path, help="also write the JSON result here")


def resolve_target(args: argparse.Namespace, *, default_script: Path | None = None) -> Target:
    """Validate the script or module the user named; raise :class:`UsageError` with one sentence."""
    return resolve_script(list(args.target or []), getattr(args, "module", None), default_script=default_script)

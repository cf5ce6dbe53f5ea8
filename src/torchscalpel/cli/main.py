"""``scalpel`` entry point: builds the parser from the command modules and maps errors to exit codes.

Exit codes: 0 ok; 2 usage error; 1 other torchscalpel error; a profiled script's own non-zero
code when it fails; ``doctor --fail-on`` uses 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from torchscalpel.errors import ScalpelError

# One module per verb under torchscalpel.cli; each defines register(subparsers) and run(args).
COMMANDS: tuple[str, ...] = (
    "profile",
    "demo",
    "analyze",
    "env",
    "export",
    "serve",
    "launch",
    "tune",
    "run",
    "plan",
    "doctor",
    "report",
    "memory",
)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag ends in one line on stderr (the error and where the help is), exit 2:
    the same shape as every other user error. Sub-parsers inherit the class."""

    def error(self, message: str) -> None:  # type: ignore[override]
        text = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {text} (see '{self.prog} -h').\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per command in :data:`COMMANDS`."""
    parser = OneLineParser(
        prog="scalpel",
        description="Measure, diagnose, tune, scale and ship an existing PyTorch training script.",
    )
    from torchscalpel import __version__

    parser.add_argument("--version", action="version", version=f"torchscalpel {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"torchscalpel.cli.{name}")
        module.register(subparsers)
    return parser


def apply_config(parser: argparse.ArgumentParser, command: str | None) -> None:
    """Lay the config file's defaults for ``command`` (scalpel.toml / pyproject.toml, see
    :mod:`torchscalpel.config`) on its sub-parser, so defaults < file < flags."""
    from torchscalpel import config
    from torchscalpel.cli import common

    common.RUNS_ROOT = None
    if command not in config.COMMANDS:
        return
    found = config.load_defaults(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    if found.values:
        sub.set_defaults(**found.values)
    common.RUNS_ROOT = found.out_root


def _command_name(args: Sequence[str]) -> str | None:
    """The verb: the first argument that is not an option (the top-level parser has only -h and --version)."""
    return next((a for a in args if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the command, and return its exit code (never raises for user errors)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        apply_config(parser, _command_name(args_list))
    except ScalpelError as exc:
        print(f"scalpel: error: {exc}", file=sys.stderr)
        return exc.exit_code
    args = parser.parse_args(args_list)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        from torchscalpel.cli.common import check_paths

        check_paths(args)
        return int(args.func(args) or 0)
    except ScalpelError as exc:
        print(f"scalpel: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("scalpel: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

"""``scalpel`` entry point: builds the parser from the command modules and maps errors to exit codes.

Exit codes: 0 ok; 2 usage error; 1 other torchscalpel error; 130 interrupted (Ctrl-C); a profiled
script's own non-zero code when it fails; ``doctor --fail-on`` uses 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from torchscalpel.errors import ScalpelError

# One module per verb under torchscalpel.cli; each defines register(subparsers) and run(args).
# In workflow order (DESIGN.md): `scalpel --help` lists them so, from checking the machine to shipping.
COMMANDS: tuple[str, ...] = (
    "env",
    "profile",
    "doctor",
    "memory",
    "tune",
    "run",
    "fix",
    "lr",
    "batch",
    "plan",
    "launch",
    "compare",
    "analyze",
    "export",
    "serve",
    "report",
    "demo",
)


def workflow_order() -> str:
    """``env, profile, doctor, memory, tune (then run), ...``: the epilog's order, from :data:`COMMANDS` so the
    two cannot drift (``run`` applies what tune wrote; ``fix`` then edits it into the script; ``report`` and ``demo`` are not steps)."""
    steps = [c for c in COMMANDS if c not in ("run", "report", "demo")]
    return ", ".join("tune (then run)" if c == "tune" else c for c in steps)


class WholeWordsFormatter(argparse.HelpFormatter):
    """argparse's help layout, but lines break only between words: a knob list or a path
    (``scalpel-runs/<time>/``) is never split mid-word or at a hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag ends in one line on stderr (the error and where the help is), exit 2:
    the same shape as every other user error. Sub-parsers inherit the class (and the whole-word help layout)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", WholeWordsFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> None:  # type: ignore[override]
        text = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {text} (see '{self.prog} -h').\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per command in :data:`COMMANDS`."""
    parser = OneLineParser(
        prog="scalpel",
        description="Measure, diagnose, tune, scale and ship an existing PyTorch training script.",
        epilog=f"Commands are listed in workflow order: {workflow_order()}. Exit codes: 0 ok; 1 a scalpel error "
        "(or findings at --fail-on); 2 a usage error; 130 interrupted; a profiled script's own non-zero code when it fails (partial results are "
        "still written). 'scalpel COMMAND -h' describes each.",
    )
    from torchscalpel.version import __version__

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
        _note_file_defaults(sub, found.values, found.source)
    common.RUNS_ROOT = found.out_root


def _note_file_defaults(sub: argparse.ArgumentParser, values: dict[str, object], source: object) -> None:
    """Say in ``-h`` which defaults the config file replaced: the help text names the built-in one."""
    from pathlib import Path

    name = Path(str(source)).name if source is not None else "the config file"
    for action in sub._actions:
        if action.dest in values and action.help not in (None, argparse.SUPPRESS):
            action.help = f"{action.help} [{name} sets {values[action.dest]}]"


INT_LIMIT = 2**63 - 1
"""Largest value an integer flag takes: argparse's ``type=int`` reads any length, and a
``--warmup 99999999999999999999999`` used to start the script and run until killed."""


def _check_int_ranges(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (:class:`UsageError`, exit 2) any integer flag of the chosen command beyond :data:`INT_LIMIT`,
    before anything starts."""
    from torchscalpel.errors import UsageError

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
    for action in sub._actions:
        value = getattr(args, action.dest, None)
        if action.type is int and isinstance(value, int) and abs(value) > INT_LIMIT:
            flag = max(action.option_strings, key=len) if action.option_strings else action.dest
            raise UsageError(f"{flag} {value} is out of range; give a whole number below 2**63.")


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
    try:  # a flag's type= (a duration, a size) raises UsageError: one line, exit 2, like every other
        args = parser.parse_args(args_list)
    except ScalpelError as exc:
        print(f"scalpel: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        _check_int_ranges(parser, args)
    except ScalpelError as exc:
        print(f"scalpel: error: {exc}", file=sys.stderr)
        return exc.exit_code
    from torchscalpel import fileio

    if fileio.is_stdout(getattr(args, "json_path", None)):
        fileio.claim_stdout()  # --json -: stdout carries the JSON alone, everything else goes to stderr
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
    finally:
        fileio.release_stdout()


if __name__ == "__main__":
    raise SystemExit(main())

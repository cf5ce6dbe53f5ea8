"""``scalpel`` entry point: builds the parser from the command modules and maps errors to exit codes.

Exit codes: 0 ok; 2 usage error (an output file that fails only when written included); 1 other torchscalpel
error, or stdout's reader gone (``| head``: quietly); 130 interrupted (Ctrl-C); a profiled script's own non-zero
code when it fails; ``doctor --fail-on`` uses 1.
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
    sub.set_defaults(out_root=found.out_root)  # the options classes default their run folder under it


def _note_file_defaults(sub: argparse.ArgumentParser, values: dict[str, object], source: object) -> None:
    """Say in ``-h`` which defaults the config file replaced: the help text names the built-in one."""
    from pathlib import Path

    name = Path(str(source)).name if source is not None else "the config file"
    for action in sub._actions:
        if action.dest in values and action.help not in (None, argparse.SUPPRESS):
            action.help = f"{action.help} [{name} sets {values[action.dest]}]"


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The sub-parser of ``command``."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]


def _command_name(args: Sequence[str]) -> str | None:
    """The verb: the first argument that is not an option (the top-level parser has only -h and --version)."""
    return next((a for a in args if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the command, and return its exit code (never raises for user errors).

    Two things every command's output needs are done here, once: text that the output's encoding cannot
    hold (a lone surrogate from a record, an accent on an ASCII terminal) is written escaped
    (``\\ud800``) instead of raising UnicodeEncodeError, and a reader that stops reading
    (``scalpel launch -h | head -1``) ends the command quietly, exit 1, as the Python documentation's
    recipe for SIGPIPE does, instead of a BrokenPipeError traceback."""
    _escape_unencodable_output()
    try:
        try:
            code = _run(argv)
        except SystemExit:  # argparse's -h / --version: what it printed must reach the pipe too
            _flush_stdout()
            raise
        _flush_stdout()  # here, not at interpreter exit, where a closed pipe prints "Exception ignored"
        return code
    except BrokenPipeError:
        _discard_stdout()
        return 1


def _escape_unencodable_output() -> None:
    """Make stdout and stderr write what their encoding cannot hold as backslash escapes: rich and print
    both write through them, so no renderer can raise UnicodeEncodeError on a record's text."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream some host replaced and that cannot change: leave it
                pass


def _flush_stdout() -> None:
    """Flush stdout (a closed pipe raises BrokenPipeError here, where :func:`main` handles it)."""
    if sys.stdout is not None:
        sys.stdout.flush()


def _discard_stdout() -> None:
    """After a BrokenPipeError: point stdout's descriptor at /dev/null, so that the interpreter's own flush
    at exit finds somewhere to write what is still buffered and prints nothing (Python's signal docs)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no real descriptor (a test's capture): nothing buffered
        pass


def _run(argv: Sequence[str] | None) -> int:
    """:func:`main`'s work: parse, check, run the command, map errors to exit codes."""
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
        from torchscalpel.cli.common import check_numbers

        check_numbers(_command_parser(parser, args.command), args)
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
    except BrokenPipeError:
        raise  # the reader went away: main() ends quietly
    except OSError as exc:
        # A file the command writes that fails only when written (a full disk, /dev/full, a folder or a
        # read-only place reached after the checks): one sentence naming the file, exit 2 (README's
        # exit-code table), not a traceback. fileio's writers fill in the file's name when the OS did not.
        print(f"scalpel: error: {_os_error_sentence(exc)}", file=sys.stderr)
        return 2
    finally:
        fileio.release_stdout()


def _os_error_sentence(exc: OSError) -> str:
    """``Could not write /dev/full: No space left on device; choose another path.`` for a failed write;
    the file and the OS's reason for any other OSError."""
    import errno

    reason = exc.strerror or str(exc)
    name = exc.filename
    if name is None:
        return f"{reason}."
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS):
        return f"Could not write {name}: {reason}; choose another path."
    return f"{name}: {reason}."


if __name__ == "__main__":
    raise SystemExit(main())

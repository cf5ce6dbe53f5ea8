"""``scalpel launch [torchrun options] -- SCRIPT [ARGS]``: run a script on several ranks.

The options are torchrun's own; the parser is built only when this command runs (importing
torch.distributed.run costs about two seconds, which every other ``scalpel`` command would pay).
"""

from __future__ import annotations

import argparse
import sys

from torchscalpel.cli.common import check_numbers
from torchscalpel.fileio import check_output_dir
from torchscalpel.units import parse_float

HELP = "run a training script on N ranks with torchrun (DDP/FSDP), rank-prefixed logs, clear failures"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``launch``; it takes its arguments verbatim and parses them with torchrun's parser."""
    parser = subparsers.add_parser(
        "launch",
        help=HELP,
        description=HELP + ". Run 'scalpel launch -h' for torchrun's options.",
        add_help=False,
        prefix_chars="\x00",  # nothing looks like an option here: torchrun's parser reads them all
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Parse with torchrun's parser into :class:`~torchscalpel.distributed.options.LaunchOptions`, then the
    launch stage; return the exit code."""
    from torchscalpel.distributed.launch import build_parser
    from torchscalpel.distributed.options import LaunchOptions
    from torchscalpel.report import launch_terminal
    from torchscalpel.stages import launch as stage

    parser = build_parser()
    argv = list(args.argv)
    head = argv[: argv.index("--")] if "--" in argv else argv
    if "--help-all" in head:
        parser.print_help()
        return 0
    if "-h" in head or "--help" in head:
        print(own_options_help(parser))
        return 0
    try:
        parsed = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed "scalpel launch: error: ..."
        return 2 if exc.code else 0
    # torchrun's own parser is left as it is; its numbers (and ours: none is negative) meet the shared
    # bounds here, and --steps the shared grammar, before a rank starts
    check_numbers(parser, parsed, minimum=0)
    if parsed.monitor_interval is not None:  # torchrun asserts it is positive, a traceback
        parse_float(str(parsed.monitor_interval), flag="--monitor-interval", above_minimum=True)
    if parsed.out is not None:
        check_output_dir(parsed.out)
    options = LaunchOptions.from_args(parsed, out_root=getattr(args, "out_root", None))
    result = stage.run(options, progress=lambda line: print(line, flush=True))
    if result.refused:
        print(f"scalpel launch: {result.refused}", file=sys.stderr)
    launch_terminal.render(result)
    return result.exit_code


OWN_OPTIONS = ("nproc", "out", "profile", "doctor", "steps", "plan", "plan_device_memory")
"""Destinations of scalpel's own launch options: 'scalpel launch -h' shows them first, in full."""


def own_options_help(parser: argparse.ArgumentParser) -> str:
    """'scalpel launch -h': scalpel's own options in full, then torchrun's flag names in a few lines
    (``--help-all`` prints torchrun's full help)."""
    import textwrap

    from torchscalpel.cli.main import WholeWordsFormatter

    own = argparse.ArgumentParser(
        prog="scalpel launch",
        add_help=False,
        formatter_class=WholeWordsFormatter,
        usage="scalpel launch [options] [torchrun options] -- SCRIPT [ARGS]",
        description=parser.description,
    )
    group = own.add_argument_group("options")
    for action in parser._actions:
        if action.dest in OWN_OPTIONS:
            group._add_action(action)
    flags = sorted(
        {
            a.option_strings[0]
            for a in parser._actions
            if a.option_strings
            and a.dest not in OWN_OPTIONS
            and a.help != argparse.SUPPRESS
            and a.option_strings[0] not in ("-h", "--help")
        }
    )
    torchrun = textwrap.fill(
        ", ".join(flags),
        width=100,
        initial_indent="  ",
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return (
        own.format_help().rstrip() + "\n\ntorchrun options (passed through; 'scalpel launch --help-all' "
        "describes each):\n" + torchrun + "\n"
    )

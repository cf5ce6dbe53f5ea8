"""``scalpel launch [torchrun options] -- SCRIPT [ARGS]``: run a script on several ranks.

The options are torchrun's own; the parser is built only when this command runs (importing
torch.distributed.run costs about two seconds, which every other ``scalpel`` command would pay).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from torchscalpel.cli.common import check_numbers, default_run_dir, steps_arg
from torchscalpel.errors import UsageError
from torchscalpel.fileio import atomic_write_text, check_output_dir
from torchscalpel.units import fmt_bytes, parse_float, parse_size

MIN_DEVICE_MEMORY = 256 << 20
"""The least --plan-device-memory taken for a device: no accelerator a training run targets has less."""
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
    """Parse with torchrun's parser, validate, launch; return the exit code."""
    from torchscalpel.distributed.launch import (
        build_parser,
        launch,
        prepare,
        watch_options,
        wrap_for_stage,
        wrap_plain,
    )

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
    steps_arg(argparse.Namespace(warmup=0, steps=parsed.steps))
    parsed = prepare(parsed)
    if parsed.out is not None:
        check_output_dir(parsed.out)
    out = parsed.out or default_run_dir("launch-" + _name(parsed.training_script))
    if parsed.plan_device_memory and not parsed.plan:
        raise UsageError("--plan-device-memory only applies with --plan.")
    if parsed.plan_strict and not parsed.plan:
        raise UsageError("--plan-strict only applies with --plan.")
    if parsed.plan_device_memory:
        size = parse_size(parsed.plan_device_memory, flag="--plan-device-memory")
        if size < MIN_DEVICE_MEMORY:
            raise UsageError(
                f"--plan-device-memory {parsed.plan_device_memory} is {fmt_bytes(size)}, too small to be "
                f"a device; give its memory, e.g. 80GiB (at least {fmt_bytes(MIN_DEVICE_MEMORY)})."
            )
    if parsed.plan:
        if parsed.module or parsed.no_python:
            raise UsageError("--plan runs a script file; drop -m/--no-python and pass the script path.")
        from torchscalpel.distributed.preflight import run_preflight

        preflight = run_preflight(parsed, out)
        for line in preflight.lines:
            print(line, flush=True)
        if parsed.plan_strict and preflight.planned and not preflight.fits:
            print("scalpel launch: --plan-strict: no strategy fits, so no rank was started.", file=sys.stderr)
            return 1
    _announce_resume(parsed)
    stage = wrap_for_stage(parsed, out)
    if stage is None:
        wrap_plain(parsed)
    with _ranks_print_one_line(stage == "doctor"):
        code = launch(parsed, out_dir=out, watch=watch_options(parsed, out))
    if stage is not None:
        _report_ranks(out, doctor=stage == "doctor", nproc=parsed.nproc_per_node)
    return code


@contextlib.contextmanager
def _ranks_print_one_line(on: bool):
    """Under --doctor each rank prints a one-line summary; the launcher prints every finding once, after."""
    import os

    from torchscalpel.doctor.ranks import MERGED_RANKS_ENV

    previous = os.environ.get(MERGED_RANKS_ENV)
    if on:
        os.environ[MERGED_RANKS_ENV] = "1"  # torchrun's workers inherit it
    try:
        yield
    finally:
        if on:
            if previous is None:
                os.environ.pop(MERGED_RANKS_ENV, None)
            else:
                os.environ[MERGED_RANKS_ENV] = previous


def _announce_resume(parsed: argparse.Namespace) -> None:
    """Say that the script will resume from a checkpoint folder here, or move it aside with --fresh."""
    from pathlib import Path

    from torchscalpel.distributed.resume import announce, find_resumes, start_fresh

    cwd = Path.cwd()
    resumes = find_resumes(cwd, list(parsed.training_script_args))
    for line in start_fresh(resumes, cwd) if parsed.fresh else announce(resumes, cwd):
        print(line, flush=True)


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


def _report_ranks(out, *, doctor: bool = False, nproc: str = "") -> None:
    """Merge the per-rank Run records, print the table (with --doctor: then the findings across and per
    rank, :func:`~torchscalpel.report.doctor_terminal.render_rank_findings`), save ``OUT/launch.json``."""
    import json

    from torchscalpel.distributed.hangwatch import watch_findings
    from torchscalpel.distributed.rankmerge import format_table, load_rank_records, merge
    from torchscalpel.distributed.rankrules import rank_findings
    from torchscalpel.findings import without_launcher_repeats

    records = load_rank_records(out)
    first = watch_findings(out) + rank_findings(out / "watch")
    if not records and not first:
        print(f"scalpel launch: no rank wrote a run record under {out}", flush=True)
        return
    merged = merge(records) if records else {"ranks": [], "straggler": None, "findings": []}
    merged["findings"] = first + without_launcher_repeats(first, merged["findings"])
    atomic_write_text(out / "launch.json", json.dumps(merged, indent=1, default=str) + "\n")
    from torchscalpel.report.launch_page import write_launch_page

    # the launch's one page: verdict (hang, straggler) first, ranks side by side, findings by rank
    write_launch_page(json.loads(json.dumps(merged, default=str)), out / "launch.html", subtitle=str(out))
    from torchscalpel.trace.layout import write_rank_traces  # OUT/traces/: HTA's TraceAnalysis(trace_dir=...)

    write_rank_traces(out)
    if not doctor:
        print(format_table(merged))
    else:
        from torchscalpel.console import make_console
        from torchscalpel.doctor.ranks import across_rank_findings, merge_rank_findings
        from torchscalpel.report.doctor_terminal import render_rank_findings

        print(format_table({**merged, "findings": []}), flush=True)
        ranks = int(nproc) if str(nproc).isdigit() else len(records)
        across = across_rank_findings(out)
        render_rank_findings(
            across,
            without_launcher_repeats(across, merge_rank_findings(records)),
            make_console(),
            ranks=ranks,
        )
    print(
        f"per-rank records: {out}/rank-*/run.json, merged: {out / 'launch.json'}, page: {out / 'launch.html'}"
    )


def _name(script: str) -> str:
    return script.rsplit("/", 1)[-1].removesuffix(".py")

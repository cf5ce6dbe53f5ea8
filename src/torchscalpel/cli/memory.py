"""``scalpel memory [options] -- SCRIPT [ARGS]`` and ``scalpel memory SNAPSHOT.pickle``.

Runs the script with tensor-level memory accounting: live memory by category (parameters, gradients,
optimizer state, activations saved for backward per module, temporaries) over the run and at the peak,
the call sites of the largest live allocations, memory that grows across steps, and with
``--memory-limit SIZE`` an out-of-memory post-mortem with the fix ladder. Given a PyTorch memory
snapshot instead of a script, explains the snapshot. See docs/memory.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from torchscalpel.cli.common import (
    add_target_arguments,
    add_window_arguments,
    default_run_dir,
    resolve_target,
)
from torchscalpel.errors import UsageError
from torchscalpel.options import usage_error
from torchscalpel.runtime.window import MEMORY_WINDOW

DEFAULT_STEPS = MEMORY_WINDOW.steps


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``memory`` sub-command."""
    p = subparsers.add_parser(
        "memory",
        help="where memory goes (by category, module and line), what grows, and why it ran out",
        description="Run a training script with tensor-level memory accounting and explain its peak, its growth "
        "across steps and, under --memory-limit SIZE (or a CUDA out-of-memory), the failing request with a fix "
        "ladder. 'scalpel memory SNAPSHOT.pickle' explains a torch.cuda.memory._dump_snapshot file. See docs/memory.md.",
    )
    p.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="stop the run when live tensors exceed SIZE (e.g. 512MiB, 2GB), on any device",
    )
    add_window_arguments(
        p,
        warmup=MEMORY_WINDOW.warmup,
        steps=f"{DEFAULT_STEPS}, or all under --memory-limit",
        steps_help="the same as 'all' here",
    )
    # None: not given. Under --memory-limit the run goes on until the script ends or crosses the limit, so
    # memory that grows slowly still reaches its out-of-memory (and its fix ladder) instead of a step-20 stop.
    p.set_defaults(steps=None)
    p.add_argument(
        "--until-eval",
        action="store_true",
        help="after the --steps window, keep measuring until the script's first evaluation (a forward "
        "under torch.no_grad(), e.g. a test loop with a larger batch) has ended",
    )
    p.add_argument(
        "--config", type=Path, help="apply the [tune] settings of this scalpel.toml, as 'scalpel run' does"
    )
    p.add_argument("--no-plan", action="store_true", help="skip the plan's numbers in the fix ladder")
    p.add_argument("--out", type=Path, help="run folder (default scalpel-runs/<time>-memory-<name>/)")
    p.add_argument("--json", dest="json_path", type=Path, help="also write the memory section as JSON here")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument(
        "--patch",
        action="store_true",
        help="also write fix.patch in the run folder: the ladder's first fitting rung as a diff of your code, "
        "as 'scalpel fix RUN_DIR' prints it (needs torchscalpel[fix])",
    )
    p.add_argument(
        "--html",
        dest="html_path",
        type=Path,
        metavar="FILE",
        help="with a SNAPSHOT: also write an HTML page of it here (self-contained, opens offline)",
    )
    add_target_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Validate, then explain a snapshot or run the script."""
    from torchscalpel.units import parse_size

    if args.memory_limit:  # a bad size is refused before anything else, a snapshot's run included
        parse_size(args.memory_limit, flag="--memory-limit")
    target_words = list(args.target or [])
    if target_words and target_words[0] == "--":
        target_words = target_words[1:]
    if not args.module and len(target_words) == 1 and _looks_like_snapshot(Path(target_words[0])):
        if args.patch:
            raise UsageError("--patch goes with a script run, not with a SNAPSHOT.pickle.")
        return _explain_snapshot(Path(target_words[0]), args)
    if args.html_path is not None:
        raise UsageError(
            "--html FILE is for a SNAPSHOT.pickle; a script run writes report.html in its run folder (--out)."
        )
    if not args.module and not target_words:
        raise UsageError(
            "Name the script after --, e.g. 'scalpel memory -- train.py', or give a SNAPSHOT.pickle."
        )
    from torchscalpel.memory.options import MemoryOptions

    try:  # the window (every step under --memory-limit) is decided in MemoryOptions, once
        options = MemoryOptions.from_args(args)
    except ValueError as exc:
        raise usage_error(exc) from None
    target = resolve_target(args)
    settings_hooks: list[Any] = []
    if args.config is not None:
        from torchscalpel.tune.apply import setup_hooks
        from torchscalpel.tune.knobs import ApplyLog
        from torchscalpel.tune.settings import read_settings_file

        settings_hooks = setup_hooks(read_settings_file(args.config), ApplyLog())
    import torchscalpel.report.memory_terminal as memory_terminal
    from torchscalpel.sections import MemorySection
    from torchscalpel.stages.memory import run_memory

    out_dir = args.out or default_run_dir(f"memory-{target.name}")
    record = run_memory(
        target,
        options,
        out_dir=out_dir,
        json_path=args.json_path,
        write_report=not args.no_report,
        setup_hooks=settings_hooks,
    )
    section = record.section(MemorySection) or MemorySection()
    from torchscalpel.console import say_lines
    from torchscalpel.runtime.run_notes import how_it_stopped

    say_lines(
        [
            f"scalpel memory: {target.name}: {how_it_stopped(record)}"
            + (f" ({record.error})" if record.error else ""),
            *memory_terminal.render(section),
            f"record: {out_dir / 'run.json'}",  # a path a line (see cli/plan.py)
            *([] if args.no_report else [f"report: {out_dir / 'report.html'}"]),
            section.next_step(("" if target.script else "-m ") + shlex.join(target.argv()), str(out_dir)),
        ]
    )
    if args.patch:
        from torchscalpel.fix.shortcut import write_run_patch

        for line in write_run_patch(out_dir):
            print(line)
    if (section.oom or {}).get("caught_by_script"):
        say_lines(
            [
                "scalpel memory: the script caught the stop at the limit (a bare 'except:' or 'except "
                "BaseException') and went on; the post-mortem above is the crossing's, and the run did not fit."
            ],
            stderr=True,
        )
        return 1
    return int(record.exit_code or 0)


def _looks_like_snapshot(path: Path) -> bool:
    return path.suffix.lower() in (".pickle", ".pkl") or (
        path.is_file() and path.suffix.lower() != ".py" and _starts_like_pickle(path)
    )


def _starts_like_pickle(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(1) == b"\x80"
    except OSError:
        return False


def _explain_snapshot(path: Path, args: argparse.Namespace) -> int:
    import json

    import torchscalpel.report.snapshot_terminal as snapshot_terminal
    from torchscalpel.memory.snapshot import explain_snapshot

    if not path.is_file():
        raise UsageError(f"{path} does not exist; give the path of a torch.cuda.memory._dump_snapshot file.")
    from torchscalpel.console import TerminalProgress

    # MiB of the native reader's two passes: a large snapshot takes seconds to tens of seconds
    with TerminalProgress("snapshot", None, f"MiB of {path.name} (checked, then explained)") as bar:
        result = explain_snapshot(
            path, lambda done, total: bar.show(completed=done >> 20, total=max(total >> 20, 1))
        )
    for line in snapshot_terminal.render(result):
        print(line)
    if args.json_path is not None:
        from torchscalpel.fileio import write_output_text

        write_output_text(args.json_path, json.dumps(result, indent=1) + "\n", flag="--json")
    html_path = getattr(args, "html_path", None)
    if html_path is not None:
        from torchscalpel.report.snapshot_page import write_snapshot_page

        try:
            write_snapshot_page(result, html_path)
        except OSError as exc:
            raise UsageError(
                f"Cannot write {html_path}: {exc.strerror or exc}; give a writable --html path."
            ) from None
        print(f"page: {html_path}")
    print(f"(read in {result['read_s']:.2f} s)", file=sys.stderr)
    return 0

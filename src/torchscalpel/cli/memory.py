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
from typing import TYPE_CHECKING, Any

from torchscalpel.cli.common import add_target_arguments, add_window_arguments
from torchscalpel.options import usage_error
from torchscalpel.runtime.window import MEMORY_WINDOW

if TYPE_CHECKING:
    from torchscalpel.memory.options import MemoryOptions

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
    """Flags -> :class:`MemoryOptions` -> a snapshot explained, or :func:`torchscalpel.stages.memory.run` ->
    the summary and the exit code."""
    from torchscalpel.memory.options import MemoryOptions

    try:  # the window (every step under --memory-limit) is decided in MemoryOptions, once
        options = MemoryOptions.from_args(args)
    except ValueError as exc:
        raise usage_error(exc) from None
    if options.snapshot is not None:
        return _explain_snapshot(options)
    import torchscalpel.report.memory_terminal as memory_terminal
    from torchscalpel.console import say_lines
    from torchscalpel.runtime.run_notes import how_it_stopped
    from torchscalpel.stages import memory as stage

    assert options.target is not None  # from_args resolved it
    target = options.target
    result = stage.run(options)
    record, out_dir, section = result.record, result.out_dir, result.section
    assert record is not None and out_dir is not None  # a script run's
    say_lines(
        [
            f"scalpel memory: {target.name}: {how_it_stopped(record)}"
            + (f" ({record.error})" if record.error else ""),
            *memory_terminal.render(section),
            f"record: {out_dir / 'run.json'}",  # a path a line (see cli/plan.py)
            *([f"report: {out_dir / 'report.html'}"] if options.report else []),
            section.next_step(("" if target.script else "-m ") + shlex.join(target.argv()), str(out_dir)),
        ]
    )
    for line in result.patch_lines:
        print(line)
    if result.caught_by_script:
        say_lines(
            [
                "scalpel memory: the script caught the stop at the limit (a bare 'except:' or 'except "
                "BaseException') and went on; the post-mortem above is the crossing's, and the run did not fit."
            ],
            stderr=True,
        )
    return result.exit_code


def _explain_snapshot(options: MemoryOptions) -> int:
    """A snapshot explained by the memory stage (the same options, read once), drawn as the reader goes, then
    printed."""
    import torchscalpel.report.snapshot_terminal as snapshot_terminal
    from torchscalpel.console import TerminalProgress
    from torchscalpel.stages import memory as stage

    assert options.snapshot is not None
    path = options.snapshot
    # MiB of the native reader's two passes: a large snapshot takes seconds to tens of seconds
    with TerminalProgress("snapshot", None, f"MiB of {path.name} (checked, then explained)") as bar:
        result = stage.run(
            options, progress=lambda done, total: bar.show(completed=done >> 20, total=max(total >> 20, 1))
        )
    assert result.snapshot is not None
    for line in snapshot_terminal.render(result.snapshot):
        print(line)
    if result.output_error is not None:
        raise result.output_error
    if result.page is not None:
        print(f"page: {result.page}")
    print(f"(read in {result.snapshot['read_s']:.2f} s)", file=sys.stderr)
    return 0

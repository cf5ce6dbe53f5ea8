"""``scalpel run [--config scalpel.toml] [--memory-limit SIZE] -- SCRIPT [ARGS]``: run a script with tuned
settings applied, or under a memory limit.

The settings ``scalpel tune`` measured are applied by the same setup hooks the trials used, and
nothing is measured: the script runs as ``python SCRIPT ARGS`` would, with its own exit code.
Without ``--config``, ``./scalpel.toml`` is applied when it exists; with ``--memory-limit`` and no
such file the script runs as it is, under the limit (a fix made in the script itself is checked so).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from torchscalpel.cli.common import (
    Target,
    add_target_arguments,
    add_tracking_arguments,
    execute_tracked,
    resolve_target,
)

DEFAULT_CONFIG = Path("scalpel.toml")
"""What ``scalpel tune`` writes and ``scalpel run`` reads when ``--config`` is not given."""


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``run`` sub-command."""
    p = subparsers.add_parser(
        "run",
        help="run a script with the settings 'scalpel tune' wrote (no measurement)",
        description="Run a training script unmodified with the [tune] settings of a scalpel.toml applied "
        "(autocast, compile regions, DataLoader arguments, ...), and nothing measured.",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"settings file (default ./{DEFAULT_CONFIG} when it exists; with --memory-limit and no such "
        "file the script runs with no tuning settings)",
    )
    p.add_argument("--show", action="store_true", help="print what each setting changed when the script ends")
    p.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="stop the script when live tensors exceed SIZE (e.g. 512MiB), "
        "on any device: shows that a fix from 'scalpel memory' fits",
    )
    add_tracking_arguments(p)
    add_target_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Read the settings (errors before the script starts), apply them, run the script."""
    from torchscalpel.runtime.limit_block import enforced
    from torchscalpel.runtime.memory_limit import MemoryLimitExceeded
    from torchscalpel.tune.apply import applied
    from torchscalpel.tune.settings import TuneSettings, read_settings_file
    from torchscalpel.units import parse_size

    limit = parse_size(args.memory_limit, flag="--memory-limit") if args.memory_limit else None
    config: Path | None = args.config
    if config is None and (limit is None or DEFAULT_CONFIG.exists()):
        config = DEFAULT_CONFIG  # a missing default without --memory-limit is the same clear error as before
    # --memory-limit alone checks the script as it is (a fix made in the code, or the limit itself).
    settings = read_settings_file(config) if config is not None else TuneSettings()
    target = resolve_target(args)
    if settings.compile is not None and settings.dataloader.num_workers:
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    origin = (
        f"from {config}"
        if config is not None
        else f"no --config and no ./{DEFAULT_CONFIG}: no tuning settings"
    )
    print(f"scalpel run: {settings.label()} ({origin})", file=sys.stderr)
    tracker = None
    with applied(settings) as log:
        try:
            with enforced(limit) as tracker:
                code = execute_tracked(args, target, execute)
        except MemoryLimitExceeded as exc:
            print(
                f"scalpel run: {exc}; see 'scalpel memory --memory-limit {args.memory_limit}' for why.",
                file=sys.stderr,
            )
            code = 1
        if tracker is not None and tracker.oom is not None and code == 0:  # the script caught the stop itself
            print(
                f"scalpel run: {tracker.oom_sentence()} (the script caught the stop and went on); see "
                f"'scalpel memory --memory-limit {args.memory_limit}' for why.",
                file=sys.stderr,
            )
            code = 1
        if tracker is not None and code == 0:
            from torchscalpel.units import fmt_bytes

            print(
                f"scalpel run: peak live tensors {fmt_bytes(tracker.peak)} under the limit "
                f"{fmt_bytes(limit)}",
                file=sys.stderr,
            )
    if args.show or log.skipped:
        for line in log.applied if args.show else []:
            print(f"scalpel run: applied {line}", file=sys.stderr)
        if args.show and not log.applied and not log.skipped:
            print(
                f"scalpel run: nothing to apply: {config or 'no config'} holds no setting that changes the run "
                "(the script ran as it is)",
                file=sys.stderr,
            )
        for line in log.skipped:
            print(f"scalpel run: not applied: {line}", file=sys.stderr)
    return code


def execute(target: Target) -> int:
    """Run the script or module as ``__main__`` with its argv; return what ``python`` would exit with.

    ``--memory-limit``'s stop goes through to :func:`run`, which explains it; Ctrl-C is 130.
    """
    from torchscalpel.runtime.memory_limit import MemoryLimitExceeded
    from torchscalpel.runtime.script import ExecOptions, run_script

    return run_script(target, ExecOptions(passthrough=(MemoryLimitExceeded,))).exit_code

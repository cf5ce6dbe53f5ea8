"""``scalpel tune [--budget 10m] [--steps N] [--knobs LIST] [--out DIR] -- SCRIPT [ARGS]``.

Measures the script as it is, tries each applicable knob in a fresh process, combines the winners,
confirms the best against the baseline in interleaved runs, and writes the settings to
scalpel.toml (for ``scalpel run``), the equivalent code lines, run.json and report.html.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from torchscalpel.cli.common import (
    add_output_arguments,
    add_target_arguments,
    add_tracking_arguments,
    add_window_arguments,
)
from torchscalpel.tune.window import CONFIRM_PAIRS, MIN_MEASURE_S, TUNE_STEPS, TUNE_WARMUP
from torchscalpel.units import duration_type, int_type


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``tune`` sub-command."""
    from torchscalpel.tune.settings import KNOB_NAMES

    p = subparsers.add_parser(
        "tune",
        help="find measured, numerics-checked speedups (compile, AMP, data loading, ...) for a script",
        description="Try tuning knobs on an unmodified script, each in a fresh process, keep only those "
        "that are faster beyond noise and keep the loss curve within tolerance, and write the winner "
        "to scalpel.toml for 'scalpel run'.",
    )
    p.add_argument(
        "--budget",
        default="10m",
        metavar="DURATION",
        help="wall-clock budget for the whole search: 90s, 10m, 1h; a bare number is seconds (default 10m)",
    )
    add_window_arguments(
        p,
        warmup=TUNE_WARMUP,
        steps="auto",
        steps_help=f"{TUNE_STEPS} per trial; 'all' is refused, since every trial must end",
    )
    p.add_argument(
        "--knobs",
        metavar="LIST",
        help=f"comma-separated knob families to try (default all: {', '.join(KNOB_NAMES)})",
    )
    p.add_argument(
        "--seed",
        # numpy's and random's seeders take 0 to 2^32 - 1; -1 failed in every trial, after the baseline
        type=int_type("--seed", maximum=2**32 - 1),
        default=0,
        help="torch.manual_seed before the script, same for every trial",
    )
    p.add_argument(
        "--compile-mode",
        default="default",
        help="comma-separated torch.compile modes to try (default 'default'; "
        "max-autotune compiles much longer)",
    )
    p.add_argument("--compile-backend", default="inductor", help=argparse.SUPPRESS)
    p.add_argument(
        "--min-measure",
        type=duration_type("--min-measure", allow_zero=True),
        default=None,
        metavar="DURATION",
        help=f"measured wall time each trial reaches at least: short steps are measured in more steps "
        f"(default {MIN_MEASURE_S:g}s with --steps auto, 0 with a given --steps)",
    )
    p.add_argument(
        "--confirm",
        type=int_type("--confirm"),
        default=CONFIRM_PAIRS,
        help=f"interleaved baseline/winner pairs to confirm (default {CONFIRM_PAIRS})",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=Path("scalpel.toml"),
        help="where to write the winning settings (default ./scalpel.toml; a file not written by "
        "scalpel tune is never overwritten)",
    )
    p.add_argument(
        "--fit",
        metavar="SIZE",
        help="find the fastest configuration whose live tensors fit in SIZE "
        "(memory knobs: checkpointing, micro-batches, bf16; see docs/memory.md)",
    )
    p.add_argument(
        "--patch",
        action="store_true",
        help="also write fix.patch in the run folder: the diff of your code 'scalpel fix RUN_DIR' prints "
        "(needs torchscalpel[fix])",
    )
    add_output_arguments(p)
    add_tracking_arguments(p)
    add_target_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Flags -> :class:`TuneOptions` -> :func:`torchscalpel.stages.tune.run` -> the table and the exit code."""
    import torchscalpel.report.tune_terminal as tune_terminal
    from torchscalpel.record import load_record
    from torchscalpel.report.tune_terminal import RichProgress
    from torchscalpel.sections import TuneSection
    from torchscalpel.stages import tune as stage
    from torchscalpel.tune.options import TuneOptions

    options = TuneOptions.from_args(args)  # every flag, --fit's too, before the target is looked at
    assert options.target is not None  # from_args resolved it
    # SIGTERM (a CI timeout, a job scheduler) ends the search like Ctrl-C: the running trial's process
    # group is killed and what was measured is saved.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        result = stage.run(options, progress=RichProgress())
    finally:
        signal.signal(signal.SIGTERM, previous)
    if result.search is None:  # --fit printed its own table
        return result.exit_code
    paths = result.paths
    saved = load_record(paths["record"])  # drawn from what was saved, as report.html is
    tune_terminal.render(
        saved.section(TuneSection) or TuneSection(),
        out_dir=result.out_dir,
        config_path=paths.get("config", paths.get("settings")),
        environment=saved.environment,  # the baseline's: its load at the start
        target_text=" ".join(str(a) for a in options.target.argv()),
    )
    if result.config_left_alone and options.config_path is not None:
        print(
            f"scalpel: {options.config_path} exists and was not written by scalpel tune; left it alone "
            f"(settings are in {paths['settings']}).",
            file=sys.stderr,
        )
    for line in result.patch_lines:
        print(line)
    return result.exit_code


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt

"""``scalpel demo``: parses the command line; the stages run in :mod:`torchscalpel.stages.demo`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torchscalpel.stages.demo import STAGES
from torchscalpel.units import duration_type, int_type


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``demo`` sub-command."""
    p = subparsers.add_parser(
        "demo",
        help="run every stage on the bundled example and print where the report is",
        description="Run env, profile, doctor, analyze, tune, plan and export/serve on the bundled "
        "examples/char_transformer.py (ship uses examples/digits_cnn.py), copied into <out>/examples/, and "
        "write one report. Without the optional dependencies (torchscalpel[all]) the ship stage is skipped.",
    )
    p.add_argument("--out", type=Path, help="output folder (default scalpel-runs/<time>-demo/)")
    p.add_argument(
        "--steps",
        type=int_type("--steps", minimum=1),
        default=12,
        help="measured steps for the profile stage (default 12)",
    )
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument(
        "--tune-budget",
        type=duration_type("--tune-budget", minimum=1.0),
        default=120.0,
        metavar="DURATION",
        help="time for the tune stage: 90s, 3m, 1h; a bare number is seconds (default 120)",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Flags -> :class:`DemoOptions` -> :func:`torchscalpel.stages.demo.run` -> the closing table; 0 when
    every stage succeeded, 1 otherwise."""
    import torchscalpel.report.demo_terminal as demo_terminal
    from torchscalpel.stages import demo as stage
    from torchscalpel.stages.demo import DemoOptions

    options = DemoOptions.from_args(args)
    result = stage.run(options)
    demo_terminal.render(result.stages, result.report)
    return result.exit_code

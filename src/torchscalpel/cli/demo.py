"""``scalpel demo``: every stage that exists, on the bundled example, into one run folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torchscalpel.cli.common import Target, default_run_dir


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``demo`` sub-command."""
    p = subparsers.add_parser(
        "demo",
        help="run every stage on the bundled example and print where the report is",
        description="Profile examples/char_transformer.py (and run every later stage that exists) "
        "and write one report.",
    )
    p.add_argument("--out", type=Path, help="output folder (default scalpel-runs/<time>-demo/)")
    p.add_argument("--steps", type=int, default=12, help="measured steps for the profile stage (default 12)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the stages in order; each stage's output lands in the same folder and report."""
    from torchscalpel.cli.profile import profile_target
    from torchscalpel.examples import example_script
    from torchscalpel.report.terminal import console
    from torchscalpel.runtime.session import RuntimeOptions

    out = args.out or default_run_dir("demo")
    c = console()
    target = Target(script=example_script("char_transformer.py"), args=["--steps", "200", "--log-every", "20"])
    c.rule("[bold]1/1 profile[/]: examples/char_transformer.py")
    options = RuntimeOptions(warmup=2, steps=args.steps, out_dir=out / "profile", profile_steps=3, name="demo")
    record, run_dir = profile_target(target, options)
    c.print(f"\n[bold green]demo done.[/] Open the report: [bold]{run_dir / 'report.html'}[/]")
    return record.exit_code or 0

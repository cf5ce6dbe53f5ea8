"""``scalpel compare RUN_A RUN_B [RUN_C ...]``: what differs between runs, and a one-line verdict.

Each run after the first is compared with the first: step time and each phase (with each run's
noise), memory peaks, loss curves (bit-identical, or the first step where they differ), throughput,
and every recorded difference (config, tune settings, code, data, seeds, environment). Prints to the
terminal; ``--json FILE`` writes the comparison, ``--html FILE`` a self-contained report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``compare`` sub-command."""
    p = subparsers.add_parser(
        "compare",
        help="compare runs: step time, phases, memory, losses, and what differs (code, config, environment)",
        description="Compare torchscalpel run folders (or run.json files) against the first one: step time "
        "and phases with each run's noise, memory peaks, loss curves, throughput, environment, config, tune "
        "settings, code and data differences, and a one-line verdict.",
    )
    p.add_argument(
        "runs", nargs="+", metavar="RUN", help="run folders or run.json files; the first is the baseline"
    )
    p.add_argument(
        "--json", dest="json_path", type=Path, help="write the comparison as JSON here ('-' for stdout)"
    )
    p.add_argument("--html", dest="html_path", type=Path, help="write a self-contained HTML report here")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Validate, compare, print (or write JSON / HTML)."""
    from torchscalpel.compare import compare_runs
    from torchscalpel.errors import UsageError

    if len(args.runs) < 2:
        raise UsageError("Name at least two runs to compare, e.g. 'scalpel compare RUN_A RUN_B'.")
    cmp = compare_runs(args.runs)
    from torchscalpel.fileio import is_stdout, write_output_text

    to_stdout = args.json_path is not None and is_stdout(args.json_path)
    if not to_stdout:  # with '--json -' stdout holds only the JSON (the entry point moved prints to stderr)
        import torchscalpel.report.compare_terminal as compare_terminal

        compare_terminal.render(cmp)
    if args.json_path is not None:
        text = json.dumps(cmp.to_dict(), indent=1, allow_nan=True) + "\n"
        write_output_text(args.json_path, text, flag="--json")  # a full disk: one sentence, not a traceback
    if args.html_path is not None:
        from torchscalpel.report.compare_page import write_html

        write_html(cmp, args.html_path)
        if not to_stdout:
            print(f"report: {args.html_path}")
    return 0

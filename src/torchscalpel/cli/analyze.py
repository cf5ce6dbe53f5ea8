"""``scalpel analyze TRACE_OR_DIR... [--json FILE] [--html FILE] [--diff OTHER...]``.

Parses and validates arguments, calls :func:`torchscalpel.trace.analyze_traces`, prints the
terminal summary and writes the JSON / HTML outputs. A truncated or corrupt trace still gets its
summary and outputs for what could be read; the command then exits 1 with the byte offset.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torchscalpel.report.analyze_terminal as analyze_terminal
from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.fileio import check_output_file, finite_json, write_output_text
from torchscalpel.report.analyze_terminal import format_diff
from torchscalpel.units import int_type


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``analyze`` sub-command."""
    p = subparsers.add_parser(
        "analyze",
        help="streaming analysis of torch.profiler traces (any size, multi-rank, diff)",
        description="Per-step GPU/CPU breakdown, top ops and kernels, overlap, stragglers and memory from "
        "torch.profiler (Kineto) traces: .json or .json.gz files, or folders of rank files.",
    )
    p.add_argument(
        "traces", nargs="+", type=Path, metavar="TRACE_OR_DIR", help="trace files or folders of rank traces"
    )
    p.add_argument(
        "--json",
        dest="json_path",
        type=Path,
        metavar="FILE",
        help="write the full result as JSON (- for standard output)",
    )
    p.add_argument(
        "--html", dest="html_path", type=Path, metavar="FILE", help="write a self-contained HTML report"
    )
    p.add_argument(
        "--diff", nargs="+", type=Path, metavar="OTHER", help="compare against these traces (B = OTHER)"
    )
    p.add_argument(
        "--top",
        type=int_type("--top", minimum=1),
        default=15,
        help="rows in the top ops / kernels tables (default 15)",
    )
    p.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    if args.top < 1:
        raise UsageError(f"--top must be at least 1 (got {args.top}).")
    for flag, path in (("--json", args.json_path), ("--html", args.html_path)):
        if path is not None:
            check_output_file(path, flag)


PROGRESS_BYTES = 20 * 1024**2
"""A trace file this large gets a line on stderr before it is read (a few seconds each at ~100 MB/s)."""


def _say_reading(index: int, count: int, path: Path) -> None:
    """``analyze: reading rank-1.json.gz (2 of 8, 410.2 MiB)`` on stderr for a large file; small ones
    read in well under a second and say nothing (stdout stays the summary alone)."""
    from torchscalpel.console import say_lines
    from torchscalpel.units import fmt_bytes

    try:
        size = path.stat().st_size
    except OSError:
        return
    if size >= PROGRESS_BYTES:
        say_lines([f"analyze: reading {path.name} ({index + 1} of {count}, {fmt_bytes(size)})"], stderr=True)


def run(args: argparse.Namespace) -> int:
    """Analyse, print, write; exit 1 (after writing) when a trace could only be read in part."""
    from torchscalpel.trace import analyze_traces, expand_paths
    from torchscalpel.trace.diff import diff_results

    _validate(args)
    expand_paths(args.traces)  # usage errors (missing paths, empty folders) before any work
    if args.diff:
        expand_paths(args.diff)
    result = analyze_traces(args.traces, top=max(args.top, 30), progress=_say_reading)
    data = result.to_dict()
    diff = None
    errors = list(result.errors)
    if args.diff:
        other = analyze_traces(args.diff, top=max(args.top, 30), progress=_say_reading)
        errors += other.errors
        diff = diff_results(result, other)
        data["diff"] = diff
    print(analyze_terminal.render(data, top=args.top))
    if diff is not None:
        print(format_diff(diff, top=args.top))
    if args.json_path:
        write_output_text(
            args.json_path,
            json.dumps(finite_json(data), indent=1, default=float, allow_nan=False),
            flag="--json",
        )
        print(f"JSON: {args.json_path}")
    if args.html_path:
        from torchscalpel.report.html import write_analysis_html

        try:
            write_analysis_html(finite_json(data), args.html_path, diff)
        except OSError as exc:
            raise UsageError(
                f"Could not write --html {args.html_path}: {exc.strerror or exc}; choose another path."
            ) from None
        print(f"HTML: {args.html_path}")
    if errors:
        first = errors[0]
        more = f" ({len(errors) - 1} more file(s) also unreadable)" if len(errors) > 1 else ""
        raise ScalpelError(f"{first['message']} The summary above covers the events before it{more}.")
    return 0

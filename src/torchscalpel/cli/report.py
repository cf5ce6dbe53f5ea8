"""``scalpel report RUN_DIR... [--out FILE]``: render Run records into one self-contained HTML page.

Any record works (profile, doctor, tune, plan, demo stages): one record gives the page its own stage
writes; several give one page with a group of sections per record. Nothing is re-measured.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.fileio import atomic_write_text

MULTI_DEFAULT = Path("scalpel-report.html")
"""Where a page of several records goes without --out (the current folder)."""
_RECORD_KEYS = ("schema_version", "name", "status")
"""Keys every saved Run record has; a JSON file without them is some other file (env.json, analysis.json)."""


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``report`` sub-command."""
    p = subparsers.add_parser(
        "report",
        help="render run records (run folders or run.json files) into one HTML report",
        description="Render one or more Run records into a self-contained report.html. One record: "
        "<RUN_DIR>/report.html by default. Several: one page with a group of sections per record, "
        f"./{MULTI_DEFAULT} by default. See docs/report.md.",
    )
    p.add_argument(
        "records", nargs="+", type=Path, metavar="RUN_DIR", help="run folder or run.json, one or more"
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help=f"the .html file to write (default <RUN_DIR>/report.html for one record, ./{MULTI_DEFAULT} "
        "for several)",
    )
    p.add_argument("--title", help="page title for several records (default 'torchscalpel report')")
    p.add_argument(
        "--check",
        action="store_true",
        help="check each record's invariants (phases sum to the step, ratios match their figures, ...) "
        "instead of rendering: one line per violation, exit 1 when there is any",
    )
    p.set_defaults(func=run)
    return p


def load_run_record(path: Path) -> Any:
    """The record at ``path`` (a run folder or its run.json), or a :class:`UsageError` with one sentence."""
    from torchscalpel.record import RECORD_FILENAME, load_record

    source = path / RECORD_FILENAME if path.is_dir() else path
    try:
        record = load_record(source)
    except ScalpelError as exc:
        message = str(exc)
        if str(source) not in message:  # the schema-version check does not know the file
            message = f"{source}: {message[:1].lower()}{message[1:]}"
        raise UsageError(message) from None
    try:  # load_record accepted the JSON; check it is a record and not another torchscalpel file
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    missing = [k for k in _RECORD_KEYS if k not in data]
    if missing:
        raise UsageError(
            f"{source} is not a run record (it has no {', '.join(missing)}); pass a run folder "
            "written by scalpel profile, doctor, tune, plan or demo, or its run.json."
        )
    return record


def output_path(records: list[Path], out: Path | None) -> Path:
    """``--out`` checked (an .html file, not a folder), or the default for these records."""
    if out is None:
        if len(records) > 1:
            return MULTI_DEFAULT
        first = records[0]
        return (first if first.is_dir() else first.parent) / "report.html"
    if out.is_dir():
        raise UsageError(
            f"--out {out} is a folder; name the .html file to write, e.g. {out / 'report.html'}."
        )
    if out.suffix.lower() not in (".html", ".htm"):
        raise UsageError(
            f"--out {out} is not an .html file; scalpel report only writes (and overwrites) .html files."
        )
    return out


def run(args: argparse.Namespace) -> int:
    """Validate every path first, then render and write the page."""
    from torchscalpel.report.fix_sections import sections_in
    from torchscalpel.report.html import RecordGroup, record_page_with, render_records

    launch = _launch_summary(args.records[0]) if len(args.records) == 1 and not args.check else None
    if launch is not None:  # a launch folder's launch.json: the launch's own page
        from torchscalpel.report.launch_page import render as render_launch

        return _write(
            output_path(list(args.records), args.out),
            render_launch(launch, subtitle=str(args.records[0])),
            "launch summary",
        )
    records = [load_run_record(p) for p in args.records]
    if args.check:
        return _check(records, args.records)
    out = output_path(list(args.records), args.out)
    fixes = [sections_in(p) for p in args.records]  # a fixed run's page shows the fix (fix.json beside it)
    if len(records) == 1:
        html = record_page_with(records[0], fixes[0])
    else:
        groups = [
            RecordGroup(record=r, source=str(p), extra=f)
            for r, p, f in zip(records, args.records, fixes, strict=True)
        ]
        names = ", ".join(g.record.name for g in groups)
        html = render_records(
            groups, title=args.title or "torchscalpel report", subtitle=f"{len(records)} records: {names}"
        )
    return _write(out, html, f"{len(records)} record{'s' if len(records) != 1 else ''}")


def _write(out: Path, html: str, what: str) -> int:
    try:
        atomic_write_text(out, html)
    except OSError as exc:
        raise UsageError(f"Cannot write --out {out}: {exc.strerror or exc}.") from None
    print(f"report written to {out} ({what})")
    return 0


def _launch_summary(path: Path) -> dict[str, Any] | None:
    """``launch.json`` (given, or in the launch folder given) parsed, when that is what ``path`` is."""
    from torchscalpel.record import RECORD_FILENAME
    from torchscalpel.report.launch_page import is_launch_summary

    source = path / "launch.json" if path.is_dir() and not (path / RECORD_FILENAME).is_file() else path
    if source.name != "launch.json" or not source.is_file():
        return None
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if is_launch_summary(data) else None


def _check(records: list[Any], paths: list[Path]) -> int:
    """``--check``: every broken invariant of every record (:func:`torchscalpel.record_check.check_invariants`)."""
    from torchscalpel.record_check import check_invariants

    broken = 0
    for record, path in zip(records, paths, strict=True):
        found = check_invariants(record)
        broken += len(found)
        print(f"{path}: " + (f"{len(found)} invariant(s) broken" if found else "consistent"))
        for sentence in found:
            print(f"  {sentence}")
    return 1 if broken else 0

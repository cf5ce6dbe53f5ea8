"""The one ending of a stage that writes a report it may fail to render: run.json first, then
report.html, and a failure to render is a note in the record (saved again), never a lost run."""

from __future__ import annotations

from pathlib import Path

from torchscalpel.record import RunRecord, save_record


def save_with_report(record: RunRecord, out_dir: Path, *, write_report: bool) -> None:
    """Save ``record`` as ``out_dir/run.json``, then (``write_report``) render ``report.html`` beside it
    and save the record again with the report's artifact or the note saying why it failed."""
    record.artifacts["record"] = "run.json"
    save_record(record, out_dir)  # first: a report that fails to render loses nothing
    if write_report:
        try:
            from torchscalpel.report.html import write_report as write_html

            write_html(record, out_dir / "report.html")
            record.artifacts["report"] = "report.html"
        except Exception as exc:
            record.notes.append(f"report.html failed: {exc!r}")
        save_record(record, out_dir)

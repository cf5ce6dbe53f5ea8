"""The one ending of every stage that writes a report it may fail to render: run.json first, then
report.html, and a failure to render is a note in the record (saved again), never a lost run.

profile, doctor, memory, lr, batch, tune, plan and the demo's stages all end here, and the stages that take
``--tensorboard`` / ``--mlflow`` hand the saved run to the trackers through :func:`track_run`."""

from __future__ import annotations

from pathlib import Path

from torchscalpel.record import RunRecord, save_record

REPORT_NAME = "report.html"
"""The HTML report's name in a run folder."""


def save_with_report(record: RunRecord, out_dir: Path, *, write_report: bool = True) -> Path | None:
    """Save ``record`` as ``out_dir/run.json``, then (``write_report``) render ``report.html`` beside it
    and save the record again with the report's artifact or the note saying why it failed. Returns the
    report's path, or None when none was asked for or it could not be rendered (the record is on disk
    either way)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    record.artifacts["record"] = "run.json"
    save_record(record, out_dir)  # first: a report that fails to render loses nothing
    if not write_report:
        return None
    written: Path | None = None
    try:
        from torchscalpel.report.html import write_report as write_html

        written = write_html(record, out_dir / REPORT_NAME)
        record.artifacts["report"] = REPORT_NAME
    except Exception as exc:
        record.notes.append(f"report.html failed: {exc!r}")
    save_record(record, out_dir)
    return written


def track_run(
    record: RunRecord, out_dir: Path | None, *, tensorboard: Path | None = None, mlflow: str | None = None
) -> list[str]:
    """Write a saved run to the trackers asked for (TensorBoard log folder, MLflow URI); one line per
    outcome (the trackers also print it), none when no tracker was asked for."""
    from torchscalpel.tracking import TrackingOptions, write_tracking

    options = TrackingOptions(tensorboard=tensorboard, mlflow=mlflow)
    if not options.any:
        return []
    return write_tracking(record, out_dir, options)

"""HTML report section for ``scalpel lr``: reads ``record.sections["lr"]`` (never measures)."""

from __future__ import annotations

from html import escape

from torchscalpel.record import RunRecord
from torchscalpel.report.charts import lines
from torchscalpel.report.lr_terminal import summary_lines
from torchscalpel.report.page import Section
from torchscalpel.sections import LrSection


def build(record: RunRecord) -> list[Section]:
    """One "Learning-rate range test" section: the summary, then loss and smoothed loss against lr (log x)."""
    lr = record.section(LrSection)
    if lr is None:
        return []
    text = "".join(f"<li>{escape(line)}</li>" for line in summary_lines(lr))
    points = [p for p in lr.points if p.get("lr")]
    if not points:
        return [Section(id="lr", title="Learning-rate range test", body=f"<ul>{text}</ul>")]
    marks = []
    if lr.suggestion:
        marks.append((float(lr.suggestion["lr"]), f"suggested {lr.suggestion['lr']:.3g}"))
    if lr.divergence:
        marks.append((float(lr.divergence["lr"]), f"diverged {lr.divergence['lr']:.3g}"))
    chart = lines(
        "lr-range-test",
        [float(p["lr"]) for p in points],
        {"loss": [p.get("loss") for p in points], "smoothed": [p.get("smoothed") for p in points]},
        x_title="learning rate (log scale)",
        y_title="loss",
        log_x=True,
        marks=marks,
    )
    return [Section(id="lr", title="Learning-rate range test", body=f"<ul>{text}</ul>{chart}")]

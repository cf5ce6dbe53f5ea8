"""HTML report section for ``scalpel lr``: reads ``record.sections["lr"]`` (never measures)."""

from __future__ import annotations

from html import escape

import torchscalpel.report.lr_terminal as lr_terminal
from torchscalpel.record import RunRecord
from torchscalpel.report.charts import lines
from torchscalpel.report.lr_terminal import finite_number
from torchscalpel.report.page import Section
from torchscalpel.sections import LrSection


def build(record: RunRecord) -> list[Section]:
    """One "Learning-rate range test" section: the summary, then loss and smoothed loss against lr (log x)."""
    lr = record.section(LrSection)
    if lr is None:
        return []
    text = "".join(f"<li>{escape(line)}</li>" for line in lr_terminal.render(lr))
    points = [p for p in lr.points if isinstance(p, dict) and finite_number(p.get("lr"))]
    if not points:
        return [Section(id="lr", title="Learning-rate range test", body=f"<ul>{text}</ul>")]
    marks = []
    # A suggestion is marked only when the sweep measured it: never on a short sweep's curve.
    suggested = (
        finite_number(lr.suggestion.get("lr"))
        if isinstance(lr.suggestion, dict) and not lr.not_measured
        else None
    )
    if suggested is not None:
        marks.append((suggested, f"suggested {suggested:.3g}"))
    diverged = finite_number(lr.divergence.get("lr")) if isinstance(lr.divergence, dict) else None
    if diverged is not None:
        marks.append((diverged, f"diverged {diverged:.3g}"))
    chart = lines(
        "lr-range-test",
        [float(p["lr"]) for p in points],
        {
            "loss": [finite_number(p.get("loss")) for p in points],
            "smoothed": [finite_number(p.get("smoothed")) for p in points],
        },
        x_title="learning rate (log scale)",
        y_title="loss",
        log_x=True,
        marks=marks,
    )
    return [Section(id="lr", title="Learning-rate range test", body=f"<ul>{text}</ul>{chart}")]

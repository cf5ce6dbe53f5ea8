"""Inline SVG charts for the HTML report: no JavaScript, no network, open anywhere offline.

Each function takes plain numbers and returns an ``<svg>`` string with ``class="chart"`` and a
``data-chart`` name, so tests (and the browser test) can find the rendered charts. Every chart has
an x and a y axis title (``text.axis-title.x-title`` / ``.y-title``) that names the unit, ticks on
nice numbers (1, 2, 2.5, 5 x 10^k), a value range fitted to the data (a loss curve is not pinned to
zero), and a legend only when it draws more than one series.

The charts live by kind: :mod:`.axes` (what they share), :mod:`.bars`, :mod:`.line`. A chart with
fewer than two points is not drawn (a one-dot chart padded the plan page): its values are a small table.
"""

from __future__ import annotations

from torchscalpel.report.charts.axes import (
    CAPACITY_COLOUR,
    CHAR_W,
    FLAT_FRACTION,
    MAX_DRAWN,
    PALETTE,
    distinct_labels,
    drawn_indices,
    nice_ticks,
    tick_label,
    value_title,
    x_tick_anchor,
)
from torchscalpel.report.charts.bars import horizontal_bars, stacked_bars
from torchscalpel.report.charts.line import lines

__all__ = [
    "CAPACITY_COLOUR",
    "CHAR_W",
    "FLAT_FRACTION",
    "MAX_DRAWN",
    "PALETTE",
    "distinct_labels",
    "drawn_indices",
    "horizontal_bars",
    "lines",
    "nice_ticks",
    "stacked_bars",
    "tick_label",
    "value_title",
    "x_tick_anchor",
]

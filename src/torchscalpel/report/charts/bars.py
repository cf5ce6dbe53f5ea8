"""Bar charts: vertical stacked bars (one bar per label, one colour per series) and horizontal bars (top ops)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape

from torchscalpel.report.charts.axes import (
    CAPACITY_COLOUR,
    CHAR_W,
    MAX_DRAWN,
    PALETTE,
    axis_titles,
    distinct_labels,
    drawn_indices,
    drawn_note,
    fmt_value,
    legend,
    legend_height,
    nice_ticks,
    svg_open,
    tick_label,
    value_title,
    values_table,
    x_tick_anchor,
    y_grid,
)


def stacked_bars(
    name: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    unit: str = "ms",
    x_title: str = "step",
    y_title: str | None = None,
    capacity: float | None = None,
    capacity_label: str = "capacity",
    peak: tuple[float, str, str | None] | None = None,
    width: int = 760,
    height: int = 280,
) -> str:
    """Vertical stacked bars: one bar per label, one colour per series (e.g. per-step phases).

    A series that is zero everywhere is left out (and out of the legend). ``capacity`` draws a dashed
    limit line labelled ``capacity_label`` when it lies within three times the tallest bar; further
    away it is named in the chart's top corner instead, so the bars stay readable. ``peak`` is
    ``(value, label, bar)``: a peak reached between the bars' samples (memory's peak inside a step, above
    its step-end totals), drawn as a line at its value, always within the scale, with a dot over ``bar``
    (the label of the bar it happened in) when that bar is drawn.
    """
    n = len(labels)
    if n == 0:
        return '<p class="empty">No data.</p>'
    if n == 1:  # one bar is not a chart: its parts as a table
        parts_of = [(k, float(v[0])) for k, v in series.items() if float(v[0])] or [
            (k, float(v[0])) for k, v in list(series.items())[:1]
        ]
        if capacity:
            parts_of.append((capacity_label, float(capacity)))
        if peak:
            parts_of.append((peak[1], float(peak[0])))
        return values_table(name, str(labels[0]), parts_of, unit)
    if n > MAX_DRAWN:  # one bar per step of a long run would be sub-pixel and megabytes of SVG
        keep = drawn_indices(n)
        chart = stacked_bars(
            name,
            [labels[i] for i in keep],
            {k: [v[i] for i in keep] for k, v in series.items()},
            unit=unit,
            x_title=x_title,
            y_title=y_title,
            capacity=capacity,
            capacity_label=capacity_label,
            peak=peak,
            width=width,
            height=height,
        )
        return chart + drawn_note(n, len(keep), "bars")
    shown = {k: v for k, v in series.items() if any(float(x) for x in v)} or dict(list(series.items())[:1])
    totals = [sum(float(values[i]) for values in shown.values()) for i in range(n)]
    top_value = max(totals) if totals else 0.0
    draw_capacity = capacity is not None and capacity > 0 and capacity <= 3 * max(top_value, 1e-12)
    hi = max(top_value, capacity if draw_capacity and capacity else 0.0, peak[0] if peak else 0.0) or 1.0
    ticks = nice_ticks(0.0, hi, 5)
    y_max = ticks[-1]
    legend_h = legend_height(list(shown), 66, width) if len(shown) > 1 else 22 if capacity or peak else 8
    left, bottom, right = 66, 40, 12
    plot_w, plot_h = width - left - right, height - bottom - legend_h
    bar_w = plot_w / n
    drawn_w = max(min(bar_w * 0.8, 90.0), 0.5)  # one or two bars stay bars, not slabs

    def to_y(v: float) -> float:
        return legend_h + plot_h * (1 - v / y_max)

    parts = [svg_open(name, width, height), y_grid(ticks, to_y, left, width - right)]
    for i, label in enumerate(labels):
        base = 0.0
        for j, (sname, values) in enumerate(series.items()):
            if sname not in shown:
                continue
            v = float(values[i])
            y_top, y_bottom = to_y(base + v), to_y(base)
            base += v
            parts.append(
                f'<rect x="{left + (i + 0.5) * bar_w - drawn_w / 2:.1f}" y="{y_top:.1f}" width="{drawn_w:.1f}" '
                f'height="{max(y_bottom - y_top, 0):.1f}" fill="{PALETTE[j % len(PALETTE)]}">'
                f"<title>{escape(str(label))} {escape(sname)}: {fmt_value(v)} {escape(unit)}</title></rect>"
            )
    # every k-th label, k from the widest label: "step 10step 11" ran together at one label per bar
    widest = max(len(str(x)) for x in labels) * CHAR_W + 8
    every = max(1, math.ceil(n / 16), math.ceil(widest / bar_w))
    for i in range(0, n, every):
        x = left + (i + 0.5) * bar_w
        text = str(labels[i])
        parts.append(
            f'<text class="tick x-tick" x="{x:.1f}" y="{legend_h + plot_h + 14:.1f}" '
            f'text-anchor="{x_tick_anchor(x, text, 0, width)}">{escape(text)}</text>'
        )
    if capacity:
        text = escape(capacity_label)
        if draw_capacity:
            y = to_y(capacity)
            parts.append(
                f'<line class="capacity" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
                f'stroke="{CAPACITY_COLOUR}" stroke-width="1.5" stroke-dasharray="6 3"/>'
            )
            parts.append(
                f'<text class="capacity-label" x="{width - right}" y="{y - 4:.1f}" text-anchor="end" '
                f'fill="{CAPACITY_COLOUR}">{text}</text>'
            )
        else:
            parts.append(
                f'<text class="capacity-label" x="{width - right}" y="13" text-anchor="end" '
                f'fill="{CAPACITY_COLOUR}">{text} (above this scale)</text>'
            )
    if peak:
        parts.append(_peak_svg(peak, list(labels), to_y, left, width - right, bar_w))
    # a series keeps its palette colour when others are left out, so one phase has one colour in every chart
    colour_of = {sname: PALETTE[j % len(PALETTE)] for j, sname in enumerate(series)}
    parts.append(legend(list(shown), left, [colour_of[n] for n in shown], width))
    parts.append(axis_titles(width, height, left, legend_h, plot_h, x_title, y_title or value_title(unit)))
    parts.append("</svg>")
    return "".join(parts)


PEAK_COLOUR = "#1d232b"


def _peak_svg(
    peak: tuple[float, str, str | None],
    labels: list[str],
    to_y: Callable[[float], float],
    left: int,
    right_edge: float,
    bar_w: float,
) -> str:
    """The peak line of :func:`stacked_bars`: dotted at its value across the plot, its label just under the
    line on the side away from the bar it happened in (inside the plot, haloed to read over a bar: above the
    line it met the legend), a dot over that bar."""
    value, text, bar = peak
    y = to_y(value)
    parts = [
        f'<line class="peak" x1="{left}" x2="{right_edge:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
        f'stroke="{PEAK_COLOUR}" stroke-width="1.2" stroke-dasharray="2 3"><title>{escape(text)}</title></line>'
    ]
    if bar is not None and bar in labels:
        x = left + (labels.index(bar) + 0.5) * bar_w
        parts.append(f'<circle class="peak" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{PEAK_COLOUR}"/>')
    # on the side away from the peak's own bar (the tallest bars stand around it), at the left when it
    # would not fit at all
    at_right = bar is None or bar not in labels or labels.index(bar) < len(labels) / 2
    fits = len(text) * CHAR_W < right_edge - left
    anchor, x = ("end", right_edge - 2) if fits and at_right else ("start", float(left) + 2)
    parts.append(
        f'<text class="peak-label" x="{x:.1f}" y="{y + 12:.1f}" text-anchor="{anchor}" fill="{PEAK_COLOUR}" '
        f'stroke="#fff" stroke-width="3" paint-order="stroke">{escape(text)}</text>'
    )
    return "".join(parts)


def horizontal_bars(
    name: str,
    items: Sequence[tuple[str, float]],
    *,
    unit: str = "ms",
    x_title: str | None = None,
    y_title: str = "",
    width: int = 760,
    bar_h: int = 18,
) -> str:
    """Horizontal bars, longest first as given (e.g. top ops by self time); long labels are cut with an
    ellipsis on the chart and kept whole in the hover title."""
    if not items:
        return '<p class="empty">No data.</p>'
    if len(items) == 1:  # one bar is not a chart
        return values_table(name, y_title or "name", items, unit)
    top_value = max(v for _, v in items) or 1.0
    ticks = nice_ticks(0.0, top_value, 5)
    x_max = ticks[-1]
    step = ticks[1] - ticks[0]
    label_w, top, bottom, right = 300, 6, 40, 70
    plot_w = width - label_w - right
    height = top + bar_h * len(items) + bottom
    plot_bottom = top + bar_h * len(items)
    parts = [svg_open(name, width, height)]
    for t in ticks:
        x = label_w + plot_w * t / x_max
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{plot_bottom}" class="grid"/>')
        parts.append(
            f'<text class="tick x-tick" x="{x:.1f}" y="{plot_bottom + 14}" text-anchor="middle">{tick_label(t, step)}</text>'
        )
    shorts = distinct_labels([label for label, _ in items], 44)
    for i, (label, value) in enumerate(items):
        y = top + i * bar_h
        w = plot_w * value / x_max
        short = shorts[i]
        parts.append(
            f'<text class="bar-label" x="{label_w - 6}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{escape(short)}'
            f"<title>{escape(label)}</title></text>"
        )
        parts.append(
            f'<rect x="{label_w}" y="{y + 2}" width="{max(w, 0.5):.1f}" height="{bar_h - 4}" fill="{PALETTE[0]}">'
            f"<title>{escape(label)}: {fmt_value(value)} {escape(unit)}</title></rect>"
        )
        parts.append(
            f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h * 0.7:.1f}">{fmt_value(value)} {escape(unit)}</text>'
        )
    parts.append(
        f'<text class="axis-title x-title" x="{label_w + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle" '
        f'font-weight="600">{escape(x_title or value_title(unit))}</text>'
    )
    cy = top + (plot_bottom - top) / 2
    parts.append(
        f'<text class="axis-title y-title" x="12" y="{cy:.1f}" text-anchor="middle" font-weight="600" '
        f'transform="rotate(-90 12 {cy:.1f})">{escape(y_title or "name")}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)

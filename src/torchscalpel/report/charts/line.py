"""Line charts over a shared x axis (loss, memory, step time over steps; the LR finder's curve on a log x)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape

from torchscalpel.report.charts.axes import (
    CAPACITY_COLOUR,
    FLAT_FRACTION,
    MAX_DRAWN,
    PALETTE,
    axis_titles,
    drawn_indices,
    drawn_note,
    fmt_value,
    legend,
    legend_height,
    log_ticks,
    mark_labels,
    nice_ticks,
    spans_decades,
    svg_open_scaled,
    tick_label,
    value_title,
    values_table,
    x_tick_anchor,
    y_grid,
    y_grid_log,
)


def lines(
    name: str,
    xs: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    *,
    unit: str = "",
    x_title: str = "step",
    y_title: str | None = None,
    zero: bool = False,
    log_x: bool = False,
    marks: Sequence[tuple[float, str]] = (),
    width: int = 760,
    height: int = 240,
) -> str:
    """Line chart of one or more series over a shared x axis (e.g. memory or loss over steps).

    ``log_x`` spaces x on a log10 scale (positive x only; ticks at powers of ten); ``marks`` draws a
    dashed vertical line with its label at each ``(x, label)`` (the LR finder's suggestion, its divergence).

    The y range fits the data (``zero=True`` keeps 0 in it); whole-number x values get whole-number
    ticks. A flat series (range under :data:`FLAT_FRACTION` of its size) gets a short chart with a
    padded range, so noise does not look like a trend and a constant does not take a full chart.
    """
    if len(xs) > MAX_DRAWN:
        keep = drawn_indices(len(xs))
        chart = lines(
            name,
            [xs[i] for i in keep],
            {k: [v[i] if i < len(v) else None for i in keep] for k, v in series.items()},
            unit=unit,
            x_title=x_title,
            y_title=y_title,
            zero=zero,
            log_x=log_x,
            marks=marks,
            width=width,
            height=height,
        )
        return chart + drawn_note(len(xs), len(keep), "points")
    points = [float(v) for values in series.values() for v in values if v is not None]
    if not xs or not points:
        return '<p class="empty">No data.</p>'
    drawn = {
        k: [(x, v) for x, v in zip(xs, values, strict=False) if v is not None] for k, values in series.items()
    }
    if max(len(p) for p in drawn.values()) < 2:  # one dot per series is not a line: the values as a table
        return values_table(
            name,
            x_title,
            [(f"{k} at {x_title} {float(p[0][0]):g}", float(p[0][1])) for k, p in drawn.items() if p],
            unit,
        )
    if log_x:
        if min(float(x) for x in xs) <= 0:
            raise ValueError("a log x axis needs positive x values")
        return _log_x_lines(
            name,
            xs,
            series,
            unit=unit,
            x_title=x_title,
            y_title=y_title,
            marks=marks,
            width=width,
            height=height,
        )
    lo, hi = min(points), max(points)
    data_lo, data_hi = lo, hi
    # a positive series over decades (a loss from 2.3 to 0.01) on a log axis: linear, its descent is flat
    log_y = not zero and spans_decades(lo, hi)
    if zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    flat = (hi - lo) <= FLAT_FRACTION * max(abs(hi), abs(lo), 1e-12)
    if flat:
        pad = max(abs(hi), abs(lo)) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
        height = min(height, 180)  # short, but tall enough for the rotated y title
    y_ticks = log_ticks(lo, hi) if log_y else nice_ticks(lo, hi, 3 if flat else 5)
    y0, y1 = y_ticks[0], y_ticks[-1]
    integer_x = all(float(x).is_integer() for x in xs)
    x0, x1 = float(min(xs)), float(max(xs))
    x_ticks = [t for t in nice_ticks(x0, x1, 8, integer=integer_x) if x0 - 1e-9 <= t <= x1 + 1e-9] or [x0]
    span_x = (x1 - x0) or 1.0
    legend_h = legend_height(list(series), 66, width)
    left, bottom, right = 66, 40, 14
    plot_w, plot_h = width - left - right, height - bottom - legend_h

    def to_x(x: float) -> float:
        return left + plot_w * ((x - x0) / span_x if x1 > x0 else 0.5)

    to_y = _y_scale(log_y, y0, y1, legend_h, plot_h)
    grid = y_grid_log if log_y else y_grid
    parts = [
        svg_open_scaled(name, width, height, log_y=log_y, lo=data_lo, hi=data_hi),
        grid(y_ticks, to_y, left, width - right),
    ]
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    for t in x_ticks:
        text = tick_label(t, x_step)
        parts.append(
            f'<text class="tick x-tick" x="{to_x(t):.1f}" y="{legend_h + plot_h + 14:.1f}" '
            f'text-anchor="{x_tick_anchor(to_x(t), text, 0, width)}">{text}</text>'
        )
    parts += _series_svg(xs, series, unit, to_x, to_y, dot_single=True)
    if flat:
        vals = [float(v) for values in series.values() for v in values if v is not None]
        parts.append(
            f'<text class="flat-note muted" x="{width - right}" y="{legend_h + 12}" text-anchor="end">'
            f"flat: {fmt_value(min(vals))} to {fmt_value(max(vals))} {escape(unit)}</text>"
        )
    parts.append(legend(list(series), left, width=width))
    title = y_title or value_title(unit)
    parts.append(
        axis_titles(
            width, height, left, legend_h, plot_h, x_title, f"{title} (log scale)" if log_y else title
        )
    )
    parts.append("</svg>")
    return "".join(parts)


def _y_scale(log_y: bool, y0: float, y1: float, top: float, plot_h: float) -> Callable[[float], float]:
    """The value axis: ``y0`` at the plot's bottom, ``y1`` at its top (``top`` px down), on a log10 scale
    when ``log_y``."""
    if log_y:
        l0, l1 = math.log10(y0), math.log10(y1)
        return lambda v: top + plot_h * (1 - (math.log10(max(v, y0)) - l0) / ((l1 - l0) or 1.0))
    return lambda v: top + plot_h * (1 - (v - y0) / ((y1 - y0) or 1.0))


def _log_x_lines(
    name: str,
    xs: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    *,
    unit: str,
    x_title: str,
    y_title: str | None,
    marks: Sequence[tuple[float, str]],
    width: int,
    height: int,
) -> str:
    """:func:`lines` with x on a log10 scale and dashed vertical marks (see there)."""
    points = [float(v) for values in series.values() for v in values if v is not None]
    lo, hi = min(points), max(points)
    # a sweep's divergence spike (50 over a descent from 2.0 to 1.1) on a log axis keeps the descent visible
    log_y = spans_decades(lo, hi)
    y_ticks = log_ticks(lo, hi) if log_y else nice_ticks(lo, hi, 5)
    y0, y1 = y_ticks[0], y_ticks[-1]
    lx = [math.log10(float(x)) for x in xs]
    x0, x1 = min(lx), max(lx)
    span_x = (x1 - x0) or 1.0
    legend_h = legend_height(list(series), 66, width)
    left, bottom, right = 66, 40, 14
    plot_w, plot_h = width - left - right, height - bottom - legend_h

    def to_x(x: float) -> float:
        return left + plot_w * ((math.log10(x) - x0) / span_x if x1 > x0 else 0.5)

    to_y = _y_scale(log_y, y0, y1, legend_h, plot_h)
    grid = y_grid_log if log_y else y_grid
    parts = [
        svg_open_scaled(name, width, height, log_y=log_y, lo=lo, hi=hi),
        grid(y_ticks, to_y, left, width - right),
    ]
    decades = range(math.ceil(x0 - 1e-9), math.floor(x1 + 1e-9) + 1)
    every = max(1, math.ceil(len(decades) / 10))
    for k in list(decades)[::every]:
        parts.append(
            f'<text class="tick x-tick" x="{to_x(10.0**k):.1f}" y="{legend_h + plot_h + 14:.1f}" '
            f'text-anchor="middle">1e{k}</text>'
        )
    parts += _series_svg(xs, series, unit, to_x, to_y, dot_single=False)
    placed = []
    for x, text in marks:
        if x <= 0:
            continue
        px = to_x(float(x))
        placed.append((px, text))
        parts.append(
            f'<line class="mark" x1="{px:.1f}" x2="{px:.1f}" y1="{legend_h}" y2="{legend_h + plot_h}" '
            f'stroke="{CAPACITY_COLOUR}" stroke-width="1.2" stroke-dasharray="5 3"><title>{escape(text)}</title></line>'
        )
    parts.append(mark_labels(placed, legend_h, left, width - right, CAPACITY_COLOUR))
    parts.append(legend(list(series), left, width=width))
    title = y_title or value_title(unit)
    parts.append(
        axis_titles(
            width, height, left, legend_h, plot_h, x_title, f"{title} (log scale)" if log_y else title
        )
    )
    parts.append("</svg>")
    return "".join(parts)


def _series_svg(
    xs: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    unit: str,
    to_x: Callable[[float], float],
    to_y: Callable[[float], float],
    *,
    dot_single: bool,
) -> list[str]:
    """One polyline per series over its non-missing points (a series with one point: a dot when
    ``dot_single``), in the palette's colours, titled with the series name and unit."""
    parts: list[str] = []
    for j, (sname, values) in enumerate(series.items()):
        colour = PALETTE[j % len(PALETTE)]
        pts = [(to_x(float(x)), to_y(float(v))) for x, v in zip(xs, values, strict=False) if v is not None]
        if not pts:
            continue
        label = f"{sname} ({unit})" if unit and unit not in sname else sname
        if len(pts) == 1 and dot_single:
            parts.append(
                f'<circle cx="{pts[0][0]:.1f}" cy="{pts[0][1]:.1f}" r="3" fill="{colour}"><title>{escape(label)}</title></circle>'
            )
            continue
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}">'
            f"<title>{escape(label)}</title></polyline>"
        )
    return parts

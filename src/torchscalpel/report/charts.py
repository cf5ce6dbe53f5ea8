"""Inline SVG charts for the HTML report: no JavaScript, no network, open anywhere offline.

Each function takes plain numbers and returns an ``<svg>`` string with ``class="chart"`` and a
``data-chart`` name, so tests (and the browser test) can find the rendered charts. Every chart has
an x and a y axis title (``text.axis-title.x-title`` / ``.y-title``) that names the unit, ticks on
nice numbers (1, 2, 2.5, 5 x 10^k), a value range fitted to the data (a loss curve is not pinned to
zero), and a legend only when it draws more than one series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
CAPACITY_COLOUR = "#b42318"

_TIME_UNITS = {"ms", "s", "us", "µs", "ns"}


def _svg_open(name: str, width: int, height: int) -> str:
    return (
        f'<svg class="chart" data-chart="{escape(name)}" viewBox="0 0 {width} {height}" width="100%" '
        f'role="img" xmlns="http://www.w3.org/2000/svg">'
    )


def nice_ticks(lo: float, hi: float, max_ticks: int = 6, *, integer: bool = False) -> list[float]:
    """Tick values on a nice step (1, 2, 2.5 or 5 x 10^k) that cover ``[lo, hi]``, at most ``max_ticks`` + 1 of them.

    ``integer`` keeps the step a whole number (step counters). A zero-width range gets a step of its own size.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi < lo:
        lo, hi = hi, lo
    span = hi - lo
    if span <= 0:
        span = abs(hi) or 1.0
        lo, hi = lo - span / 2, hi + span / 2
    raw = span / max(1, max_ticks)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    if integer:
        step = max(1.0, float(round(step)))
    first = math.floor(lo / step + 1e-9) * step
    last = math.ceil(hi / step - 1e-9) * step
    count = round((last - first) / step)
    return [round(first + i * step, 12) for i in range(count + 1)]


def tick_label(value: float, step: float) -> str:
    """``value`` with as many decimals as the tick step needs (``0.25`` -> 2, ``50`` -> 0), thousands separated."""
    decimals = next(
        (d for d in range(7) if abs(step * 10**d - round(step * 10**d)) < 1e-6 * max(1.0, step * 10**d)), 6
    )
    text = f"{value:,.{decimals}f}"
    return "0" if text in ("-0", "-0.0", "-0.00") else text


def _fmt(value: float) -> str:
    """A data value for hover titles and bar-end labels (3 significant figures or more)."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


CHAR_W = 6.6
"""Estimated width of one character of the charts' 11 px tick font, in px (for spacing and clipping)."""


def x_tick_anchor(x: float, text: str, left: float, right_edge: float) -> str:
    """``text-anchor`` for an x tick label at ``x``: centred, unless half the label would cross the plot's
    edge (the last tick of a line chart was clipped to "12,00("), then aligned to that edge."""
    half = len(text) * CHAR_W / 2
    if x + half > right_edge:
        return "end"
    if x - half < left:
        return "start"
    return "middle"


def distinct_labels(labels: Sequence[str], limit: int) -> list[str]:
    """Each label cut to ``limit`` characters so that different names stay different on the chart: the
    head and the tail are kept around a middle ellipsis (two ops that shared their first 43 characters
    were both shown as the same "…" label); a number is appended to any that still collide."""
    head = (limit - 1) // 2
    tail = limit - 1 - head
    short = [x if len(x) <= limit else x[:head] + "…" + x[-tail:] for x in labels]
    seen: dict[str, int] = {}
    out = []
    for x in short:
        seen[x] = seen.get(x, 0) + 1
        out.append(x if seen[x] == 1 else f"{x} #{seen[x]}")
    return out


def value_title(unit: str) -> str:
    """The default value-axis title for ``unit``: ``time (ms)`` for a time unit, else the unit itself."""
    if not unit:
        return "value"
    return f"time ({unit})" if unit in _TIME_UNITS else unit


def _axis_titles(
    width: int, height: int, left: int, top: int, plot_h: float, x_title: str, y_title: str
) -> str:
    cy = top + plot_h / 2
    return (
        f'<text class="axis-title x-title" x="{left + (width - left) / 2:.1f}" y="{height - 4}" '
        f'text-anchor="middle" font-weight="600">{escape(x_title)}</text>'
        f'<text class="axis-title y-title" x="12" y="{cy:.1f}" text-anchor="middle" font-weight="600" '
        f'transform="rotate(-90 12 {cy:.1f})">{escape(y_title)}</text>'
    )


def _legend(names: Sequence[str], left: int, colours: Sequence[str] | None = None) -> str:
    """The legend (only for two or more series); ``colours[i]`` is series i's colour (default: the palette in order)."""
    if len(names) < 2:
        return ""
    colours = list(colours or [PALETTE[j % len(PALETTE)] for j in range(len(names))])
    parts, x = [], left
    for j, sname in enumerate(names):
        parts.append(f'<rect class="legend" x="{x}" y="4" width="10" height="10" fill="{colours[j]}"/>')
        parts.append(f'<text x="{x + 14}" y="13">{escape(sname)}</text>')
        x += 14 + 7 * len(sname) + 16
    return '<g class="legend">' + "".join(parts) + "</g>"


def _y_grid(ticks: Sequence[float], to_y, left: int, right_x: float) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    parts = []
    for t in ticks:
        y = to_y(t)
        parts.append(f'<line x1="{left}" x2="{right_x:.1f}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text class="tick y-tick" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{tick_label(t, step)}</text>'
        )
    return "".join(parts)


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
    width: int = 760,
    height: int = 280,
) -> str:
    """Vertical stacked bars: one bar per label, one colour per series (e.g. per-step phases).

    A series that is zero everywhere is left out (and out of the legend). ``capacity`` draws a dashed
    limit line labelled ``capacity_label`` when it lies within three times the tallest bar; further
    away it is named in the chart's top corner instead, so the bars stay readable.
    """
    n = len(labels)
    if n == 0:
        return '<p class="empty">No data.</p>'
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
            width=width,
            height=height,
        )
        return chart + _drawn_note(n, len(keep), "bars")
    shown = {k: v for k, v in series.items() if any(float(x) for x in v)} or dict(list(series.items())[:1])
    totals = [sum(float(values[i]) for values in shown.values()) for i in range(n)]
    top_value = max(totals) if totals else 0.0
    draw_capacity = capacity is not None and capacity > 0 and capacity <= 3 * max(top_value, 1e-12)
    hi = max(top_value, capacity if draw_capacity and capacity else 0.0) or 1.0
    ticks = nice_ticks(0.0, hi, 5)
    y_max = ticks[-1]
    legend_h = 22 if len(shown) > 1 or capacity else 8
    left, bottom, right = 66, 40, 12
    plot_w, plot_h = width - left - right, height - bottom - legend_h
    bar_w = plot_w / n
    drawn_w = max(min(bar_w * 0.8, 90.0), 0.5)  # one or two bars stay bars, not slabs

    def to_y(v: float) -> float:
        return legend_h + plot_h * (1 - v / y_max)

    parts = [_svg_open(name, width, height), _y_grid(ticks, to_y, left, width - right)]
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
                f"<title>{escape(str(label))} {escape(sname)}: {_fmt(v)} {escape(unit)}</title></rect>"
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
    # a series keeps its palette colour when others are left out, so one phase has one colour in every chart
    colour_of = {sname: PALETTE[j % len(PALETTE)] for j, sname in enumerate(series)}
    parts.append(_legend(list(shown), left, [colour_of[n] for n in shown]))
    parts.append(_axis_titles(width, height, left, legend_h, plot_h, x_title, y_title or value_title(unit)))
    parts.append("</svg>")
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
    top_value = max(v for _, v in items) or 1.0
    ticks = nice_ticks(0.0, top_value, 5)
    x_max = ticks[-1]
    step = ticks[1] - ticks[0]
    label_w, top, bottom, right = 300, 6, 40, 70
    plot_w = width - label_w - right
    height = top + bar_h * len(items) + bottom
    plot_bottom = top + bar_h * len(items)
    parts = [_svg_open(name, width, height)]
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
            f'<text x="{label_w - 6}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{escape(short)}'
            f"<title>{escape(label)}</title></text>"
        )
        parts.append(
            f'<rect x="{label_w}" y="{y + 2}" width="{max(w, 0.5):.1f}" height="{bar_h - 4}" fill="{PALETTE[0]}">'
            f"<title>{escape(label)}: {_fmt(value)} {escape(unit)}</title></rect>"
        )
        parts.append(
            f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h * 0.7:.1f}">{_fmt(value)} {escape(unit)}</text>'
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


MAX_DRAWN = 1000
"""Most points (or bars) one chart draws: a run of 800k steps is drawn as every k-th step, so the page's
size and the time to build it do not grow with the run (the tables keep the full statistics)."""


def drawn_indices(n: int, limit: int = MAX_DRAWN) -> range | list[int]:
    """The indices of ``n`` points a chart draws: all of them, or every k-th (the last one kept)."""
    if n <= limit:
        return range(n)
    stride = -(-n // (limit - 1))
    picked = list(range(0, n, stride))
    if picked[-1] != n - 1:
        picked.append(n - 1)
    return picked


def _drawn_note(n: int, drawn: int, what: str) -> str:
    return "" if drawn == n else f'<p class="muted">{drawn:,} of {n:,} {what} drawn (evenly spaced).</p>'


FLAT_FRACTION = 0.02
"""A series whose range is below this fraction of its size is drawn as a short, flat chart."""


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
        return chart + _drawn_note(len(xs), len(keep), "points")
    points = [float(v) for values in series.values() for v in values if v is not None]
    if not xs or not points:
        return '<p class="empty">No data.</p>'
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
    if zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    flat = (hi - lo) <= FLAT_FRACTION * max(abs(hi), abs(lo), 1e-12)
    if flat:
        pad = max(abs(hi), abs(lo)) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
        height = min(height, 180)  # short, but tall enough for the rotated y title
    y_ticks = nice_ticks(lo, hi, 3 if flat else 5)
    y0, y1 = y_ticks[0], y_ticks[-1]
    integer_x = all(float(x).is_integer() for x in xs)
    x0, x1 = float(min(xs)), float(max(xs))
    x_ticks = [t for t in nice_ticks(x0, x1, 8, integer=integer_x) if x0 - 1e-9 <= t <= x1 + 1e-9] or [x0]
    span_x = (x1 - x0) or 1.0
    legend_h = 22 if len(series) > 1 else 8
    left, bottom, right = 66, 40, 14
    plot_w, plot_h = width - left - right, height - bottom - legend_h

    def to_x(x: float) -> float:
        return left + plot_w * ((x - x0) / span_x if x1 > x0 else 0.5)

    def to_y(v: float) -> float:
        return legend_h + plot_h * (1 - (v - y0) / ((y1 - y0) or 1.0))

    parts = [_svg_open(name, width, height), _y_grid(y_ticks, to_y, left, width - right)]
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    for t in x_ticks:
        text = tick_label(t, x_step)
        parts.append(
            f'<text class="tick x-tick" x="{to_x(t):.1f}" y="{legend_h + plot_h + 14:.1f}" '
            f'text-anchor="{x_tick_anchor(to_x(t), text, 0, width)}">{text}</text>'
        )
    for j, (sname, values) in enumerate(series.items()):
        colour = PALETTE[j % len(PALETTE)]
        pts = [(to_x(float(x)), to_y(float(v))) for x, v in zip(xs, values, strict=False) if v is not None]
        if not pts:
            continue
        label = f"{sname} ({unit})" if unit and unit not in sname else sname
        if len(pts) == 1:
            parts.append(
                f'<circle cx="{pts[0][0]:.1f}" cy="{pts[0][1]:.1f}" r="3" fill="{colour}"><title>{escape(label)}</title></circle>'
            )
            continue
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}">'
            f"<title>{escape(label)}</title></polyline>"
        )
    if flat:
        vals = [float(v) for values in series.values() for v in values if v is not None]
        parts.append(
            f'<text class="flat-note muted" x="{width - right}" y="{legend_h + 12}" text-anchor="end">'
            f"flat: {_fmt(min(vals))} to {_fmt(max(vals))} {escape(unit)}</text>"
        )
    parts.append(_legend(list(series), left))
    parts.append(_axis_titles(width, height, left, legend_h, plot_h, x_title, y_title or value_title(unit)))
    parts.append("</svg>")
    return "".join(parts)


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
    y_ticks = nice_ticks(lo, hi, 5)
    y0, y1 = y_ticks[0], y_ticks[-1]
    lx = [math.log10(float(x)) for x in xs]
    x0, x1 = min(lx), max(lx)
    span_x = (x1 - x0) or 1.0
    legend_h = 22 if len(series) > 1 else 8
    left, bottom, right = 66, 40, 14
    plot_w, plot_h = width - left - right, height - bottom - legend_h

    def to_x(x: float) -> float:
        return left + plot_w * ((math.log10(x) - x0) / span_x if x1 > x0 else 0.5)

    def to_y(v: float) -> float:
        return legend_h + plot_h * (1 - (v - y0) / ((y1 - y0) or 1.0))

    parts = [_svg_open(name, width, height), _y_grid(y_ticks, to_y, left, width - right)]
    decades = range(math.ceil(x0 - 1e-9), math.floor(x1 + 1e-9) + 1)
    every = max(1, math.ceil(len(decades) / 10))
    for k in list(decades)[::every]:
        parts.append(
            f'<text class="tick x-tick" x="{to_x(10.0**k):.1f}" y="{legend_h + plot_h + 14:.1f}" '
            f'text-anchor="middle">1e{k}</text>'
        )
    for j, (sname, values) in enumerate(series.items()):
        colour = PALETTE[j % len(PALETTE)]
        pts = [(to_x(float(x)), to_y(float(v))) for x, v in zip(xs, values, strict=False) if v is not None]
        if not pts:
            continue
        label = f"{sname} ({unit})" if unit and unit not in sname else sname
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}">'
            f"<title>{escape(label)}</title></polyline>"
        )
    for x, text in marks:
        if x <= 0:
            continue
        px = to_x(float(x))
        parts.append(
            f'<line class="mark" x1="{px:.1f}" x2="{px:.1f}" y1="{legend_h}" y2="{legend_h + plot_h}" '
            f'stroke="{CAPACITY_COLOUR}" stroke-width="1.2" stroke-dasharray="5 3"><title>{escape(text)}</title></line>'
        )
        parts.append(
            f'<text class="mark-label" x="{px + 3:.1f}" y="{legend_h + 12}" fill="{CAPACITY_COLOUR}">{escape(text)}</text>'
        )
    parts.append(_legend(list(series), left))
    parts.append(_axis_titles(width, height, left, legend_h, plot_h, x_title, y_title or value_title(unit)))
    parts.append("</svg>")
    return "".join(parts)

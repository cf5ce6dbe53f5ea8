"""What every chart shares: the palette, nice ticks and their labels, axis titles, the legend, the y grid,
label spacing and clipping, how many points a chart draws, and the table a chart with fewer than two points
becomes instead."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
CAPACITY_COLOUR = "#b42318"

TIME_UNITS = {"ms", "s", "us", "µs", "ns"}


def svg_open(name: str, width: int, height: int) -> str:
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


def fmt_value(value: float) -> str:
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
    return f"time ({unit})" if unit in TIME_UNITS else unit


def axis_titles(
    width: int, height: int, left: int, top: int, plot_h: float, x_title: str, y_title: str
) -> str:
    cy = top + plot_h / 2
    return (
        f'<text class="axis-title x-title" x="{left + (width - left) / 2:.1f}" y="{height - 4}" '
        f'text-anchor="middle" font-weight="600">{escape(x_title)}</text>'
        f'<text class="axis-title y-title" x="12" y="{cy:.1f}" text-anchor="middle" font-weight="600" '
        f'transform="rotate(-90 12 {cy:.1f})">{escape(y_title)}</text>'
    )


LEGEND_ROW = 16
"""Height of one row of the legend, in px."""


def _legend_places(names: Sequence[str], left: int, width: int) -> list[tuple[str, float, int]]:
    """Each entry's shown name, x and row: entries wrap to a new row where the next would cross the chart's
    right edge (tune's five loss curves ran off the chart), and a name longer than a row is cut."""
    room = width - left - 8
    shown = distinct_labels(names, max(8, int((room - 30) / 7)))
    places, x, row = [], float(left), 0
    for name in shown:
        need = 14 + 7 * len(name) + 16
        if x > left and x + need - 16 > left + room:
            x, row = float(left), row + 1
        places.append((name, x, row))
        x += need
    return places


def legend_height(names: Sequence[str], left: int, width: int) -> int:
    """The band the legend takes above the plot (8 px without one: a single series has no legend)."""
    if len(names) < 2:
        return 8
    return 22 + LEGEND_ROW * max(row for _, _, row in _legend_places(names, left, width))


def legend(names: Sequence[str], left: int, colours: Sequence[str] | None = None, width: int = 760) -> str:
    """The legend (only for two or more series), in rows that stay inside ``width``; ``colours[i]`` is series
    i's colour (default: the palette in order)."""
    if len(names) < 2:
        return ""
    colours = list(colours or [PALETTE[j % len(PALETTE)] for j in range(len(names))])
    parts = []
    for j, (sname, x, row) in enumerate(_legend_places(names, left, width)):
        y = 4 + row * LEGEND_ROW
        parts.append(f'<rect class="legend" x="{x:.0f}" y="{y}" width="10" height="10" fill="{colours[j]}"/>')
        parts.append(f'<text x="{x + 14:.0f}" y="{y + 9}">{escape(sname)}</text>')
    return '<g class="legend">' + "".join(parts) + "</g>"


def y_grid(ticks: Sequence[float], to_y: Callable[[float], float], left: int, right_x: float) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    parts = []
    for t in ticks:
        y = to_y(t)
        parts.append(f'<line x1="{left}" x2="{right_x:.1f}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text class="tick y-tick" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{tick_label(t, step)}</text>'
        )
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


def drawn_note(n: int, drawn: int, what: str) -> str:
    return "" if drawn == n else f'<p class="muted">{drawn:,} of {n:,} {what} drawn (evenly spaced).</p>'


FLAT_FRACTION = 0.02
"""A series whose range is below this fraction of its size is drawn as a short, flat chart."""


def values_table(name: str, head: str, rows: Sequence[tuple[str, float]], unit: str) -> str:
    """What a chart with fewer than two points shows instead: its values as a small table (a chart of one
    bar or one dot padded the plan page and said less than a line of text). ``data-chart`` keeps the name."""
    suffix = f" {escape(unit)}" if unit else ""
    body = "".join(
        f'<tr><td>{escape(str(label))}</td><td class="num">{fmt_value(float(v))}{suffix}</td></tr>'
        for label, v in rows
    )
    return (
        f'<table class="chart-values" data-chart="{escape(name)}"><thead><tr><th>{escape(head)}</th>'
        f'<th class="num">{escape(value_title(unit))}</th></tr></thead><tbody>{body}</tbody></table>'
    )


LOG_RATIO = 10.0
"""A positive series whose largest value is this many times its smallest or more spans decades: its axis is
drawn on a log scale (one divergence spike of 50 above a descent from 2.0 to 1.1 flattened the descent)."""


def spans_decades(lo: float, hi: float) -> bool:
    """True when ``[lo, hi]`` is positive and spans a decade or more (:data:`LOG_RATIO`): a log axis."""
    return lo > 0 and math.isfinite(hi) and hi >= LOG_RATIO * lo


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a log axis that cover ``[lo, hi]`` (both positive): powers of ten, with 2 and 5 between them
    when the range spans three decades or fewer, from the last tick at or below ``lo`` to the first at or
    above ``hi``."""
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1.0, 2.0, 5.0) if k1 - k0 <= 3 else (1.0,)
    ticks = [float(f"{m * 10.0**k:.12g}") for k in range(k0, k1 + 1) for m in steps]
    lower = max((t for t in ticks if t <= lo * (1 + 1e-12)), default=ticks[0])
    upper = min((t for t in ticks if t >= hi * (1 - 1e-12)), default=ticks[-1])
    return [t for t in ticks if lower <= t <= upper]


def log_tick_label(value: float) -> str:
    """A log axis's tick: plain digits from 0.001 to 10,000 (``0.02``, ``50``), a power of ten beyond."""
    if 1e-3 <= value <= 1e4:
        return f"{value:,g}"
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = value / 10.0**exponent
    return f"1e{exponent}" if abs(mantissa - 1) < 1e-9 else f"{mantissa:g}e{exponent}"


def y_grid_log(ticks: Sequence[float], to_y: Callable[[float], float], left: int, right_x: float) -> str:
    """:func:`y_grid` for a log axis (labels by :func:`log_tick_label`)."""
    parts = []
    for t in ticks:
        y = to_y(t)
        parts.append(f'<line x1="{left}" x2="{right_x:.1f}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text class="tick y-tick" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{log_tick_label(t)}</text>'
        )
    return "".join(parts)


def svg_open_scaled(name: str, width: int, height: int, *, log_y: bool, lo: float, hi: float) -> str:
    """:func:`svg_open` naming the value axis's scale and the data's range (``data-y-scale``, ``data-y-min``,
    ``data-y-max``): what the browser test checks a log axis against."""
    head = svg_open(name, width, height)
    scale = "log" if log_y else "linear"
    return f'{head[:-1]} data-y-scale="{scale}" data-y-min="{lo:.6g}" data-y-max="{hi:.6g}">'


def mark_labels(
    marks: Sequence[tuple[float, str]], top: float, left: float, right_edge: float, colour: str
) -> str:
    """Each vertical mark's label at its x (``marks`` as drawn: ``(px, text)``), on its own row from ``top``
    down so that two near marks never overlap, and on the mark's left where the right would cross the chart's
    edge (the divergence at a sweep's end was clipped to "diverg")."""
    parts = []
    for k, (px, text) in enumerate(marks):
        wide = len(text) * CHAR_W
        if px + 3 + wide > right_edge:
            x, anchor = max(left + wide, px - 3), "end"
        else:
            x, anchor = px + 3, "start"
        parts.append(
            f'<text class="mark-label" x="{x:.1f}" y="{top + 12 + 13 * k:.1f}" text-anchor="{anchor}" '
            f'fill="{colour}">{escape(text)}</text>'
        )
    return "".join(parts)

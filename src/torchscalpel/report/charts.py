"""Inline SVG charts for the HTML report: no JavaScript, no network, open anywhere offline.

Each function takes plain numbers and returns an ``<svg>`` string with ``class="chart"`` and a
``data-chart`` name, so tests (and the browser test) can find the rendered charts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def _fmt(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def stacked_bars(
    name: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    unit: str = "ms",
    width: int = 760,
    height: int = 260,
) -> str:
    """Vertical stacked bars: one bar per label, one colour per series (e.g. per-step phases)."""
    n = len(labels)
    if n == 0:
        return '<p class="empty">No data.</p>'
    totals = [sum(float(values[i]) for values in series.values()) for i in range(n)]
    top = max(totals) or 1.0
    left, bottom, right, legend_h = 48, 24, 10, 22
    plot_w, plot_h = width - left - right, height - bottom - legend_h
    bar_w = plot_w / n
    parts = [
        f'<svg class="chart" data-chart="{escape(name)}" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" xmlns="http://www.w3.org/2000/svg">'
    ]
    for frac in (0.0, 0.5, 1.0):
        y = legend_h + plot_h * (1 - frac)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(top * frac)}</text>')
    for i, label in enumerate(labels):
        y = legend_h + plot_h
        for j, (sname, values) in enumerate(series.items()):
            h = plot_h * float(values[i]) / top
            y -= h
            parts.append(
                f'<rect x="{left + i * bar_w + bar_w * 0.1:.1f}" y="{y:.1f}" width="{max(bar_w * 0.8, 0.5):.1f}" '
                f'height="{max(h, 0):.1f}" fill="{PALETTE[j % len(PALETTE)]}">'
                f"<title>{escape(str(label))} {escape(sname)}: {_fmt(float(values[i]))} {unit}</title></rect>"
            )
    step = max(1, n // 12)
    for i in range(0, n, step):
        parts.append(
            f'<text x="{left + (i + 0.5) * bar_w:.1f}" y="{height - 6}" text-anchor="middle">{escape(str(labels[i]))}</text>'
        )
    x = left
    for j, sname in enumerate(series):
        parts.append(f'<rect x="{x}" y="4" width="10" height="10" fill="{PALETTE[j % len(PALETTE)]}"/>')
        parts.append(f'<text x="{x + 14}" y="13">{escape(sname)}</text>')
        x += 14 + 8 * len(sname) + 16
    parts.append("</svg>")
    return "".join(parts)


def horizontal_bars(
    name: str, items: Sequence[tuple[str, float]], *, unit: str = "ms", width: int = 760, bar_h: int = 18
) -> str:
    """Horizontal bars, longest first as given (e.g. top ops by self time)."""
    if not items:
        return '<p class="empty">No data.</p>'
    top = max(v for _, v in items) or 1.0
    label_w = 300
    height = bar_h * len(items) + 8
    parts = [
        f'<svg class="chart" data-chart="{escape(name)}" viewBox="0 0 {width} {height}" width="100%" '
        f'role="img" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, (label, value) in enumerate(items):
        y = 4 + i * bar_h
        w = (width - label_w - 80) * value / top
        short = label if len(label) <= 44 else label[:41] + "..."
        parts.append(f'<text x="{label_w - 6}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{escape(short)}</text>')
        parts.append(
            f'<rect x="{label_w}" y="{y + 2}" width="{max(w, 0.5):.1f}" height="{bar_h - 4}" fill="{PALETTE[0]}">'
            f"<title>{escape(label)}: {_fmt(value)} {unit}</title></rect>"
        )
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h * 0.7:.1f}">{_fmt(value)} {unit}</text>')
    parts.append("</svg>")
    return "".join(parts)


def lines(
    name: str,
    xs: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    *,
    unit: str = "",
    width: int = 760,
    height: int = 240,
) -> str:
    """Line chart of one or more series over a shared x axis (e.g. memory or loss over steps)."""
    points = [float(v) for values in series.values() for v in values if v is not None]
    if not xs or not points:
        return '<p class="empty">No data.</p>'
    lo, hi = min(0.0, min(points)), max(points) or 1.0
    x0, x1 = float(min(xs)), float(max(xs))
    span_x = (x1 - x0) or 1.0
    left, bottom, right, legend_h = 64, 24, 10, 22
    plot_w, plot_h = width - left - right, height - bottom - legend_h
    parts = [
        f'<svg class="chart" data-chart="{escape(name)}" viewBox="0 0 {width} {height}" width="100%" '
        f'role="img" xmlns="http://www.w3.org/2000/svg">'
    ]
    for frac in (0.0, 0.5, 1.0):
        y = legend_h + plot_h * (1 - frac)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(lo + (hi - lo) * frac)}</text>')
    for j, (sname, values) in enumerate(series.items()):
        coords = [
            f"{left + plot_w * (float(x) - x0) / span_x:.1f},{legend_h + plot_h * (1 - (float(v) - lo) / ((hi - lo) or 1)):.1f}"
            for x, v in zip(xs, values, strict=False)
            if v is not None
        ]
        parts.append(
            f'<polyline fill="none" stroke="{PALETTE[j % len(PALETTE)]}" stroke-width="2" points="{" ".join(coords)}">'
            f"<title>{escape(sname)} {escape(unit)}</title></polyline>"
        )
        parts.append(f'<rect x="{left + j * 160}" y="4" width="10" height="10" fill="{PALETTE[j % len(PALETTE)]}"/>')
        parts.append(f'<text x="{left + j * 160 + 14}" y="13">{escape(sname)}</text>')
    parts.append(f'<text x="{left}" y="{height - 6}">{_fmt(x0)}</text>')
    parts.append(f'<text x="{width - right}" y="{height - 6}" text-anchor="end">{_fmt(x1)}</text>')
    parts.append("</svg>")
    return "".join(parts)

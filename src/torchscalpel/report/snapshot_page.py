"""The HTML page of a memory snapshot (``scalpel memory SNAPSHOT --html FILE``): one self-contained file
(inline SVG, no scripts, opens offline), where PyTorch's memory_viz needs a CDN. The verdict leads:
out-of-memory requests, the phase that holds most and its fix, fragmentation; then allocated and reserved
over the trace, what is live by phase, by call site, and the largest blocks with their call sites."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from torchscalpel.fileio import atomic_write_text
from torchscalpel.report import charts
from torchscalpel.report.html import render_page
from torchscalpel.report.page import Section, table
from torchscalpel.report.snapshot_terminal import PHASE_FIX, PHASE_WORDS
from torchscalpel.units import fmt_bytes

RESERVED_NOT_MEASURED = (
    "Reserved over time: not measured: the trace holds no segment events (segment_alloc, segment_free), "
    "so only allocated bytes are drawn."
)


def _timeline(trace: dict[str, Any]) -> str:
    """Allocated (and reserved) bytes over the trace's events, as the readers kept them: each point the most
    live in its slice of ``stride`` events, so the chart's top is the trace's peak."""
    tl = trace.get("timeline") or {}
    allocated = tl.get("allocated") or []
    if not allocated:
        return ""
    mib = 1024**2
    stride = int(tl.get("stride") or 1)
    series: dict[str, list[float | None]] = {"allocated": [v / mib for v in allocated]}
    reserved = tl.get("reserved")
    if reserved is not None:
        series["reserved"] = [v / mib for v in reserved]
    note = "" if reserved is not None else f"<p class='muted'>{escape(RESERVED_NOT_MEASURED)}</p>"
    per = f"each point: the most in {stride:,} events" if stride > 1 else "one point per event"
    return note + charts.lines(
        "snapshot-timeline",
        [i * stride for i in range(len(allocated))],
        series,
        unit="MiB",
        x_title=f"allocator event ({per})",
        y_title="MiB above the trace's start",
    )


def _verdict(r: dict[str, Any]) -> Section:
    parts: list[str] = []
    for o in r.get("ooms") or []:
        parts.append(
            f'<p class="sev-error">Out of memory: asked for {escape(fmt_bytes(o.get("bytes")))} at '
            f"<code>{escape(str(o.get('site')))}</code>.</p>"
        )
    allocated = r.get("allocated") or 0
    phases = {k: v for k, v in (r.get("phases") or {}).items() if v}
    if set(phases) - {"other"} and allocated:
        top, top_bytes = max(phases.items(), key=lambda kv: kv[1])
        parts.append(
            f"<p>Most of the allocated memory is <b>{escape(PHASE_WORDS.get(top, top))}</b>: "
            f"{escape(fmt_bytes(top_bytes))}, {top_bytes / allocated:.0%} of {escape(fmt_bytes(allocated))}.</p>"
        )
        if top in PHASE_FIX and top_bytes >= 0.3 * allocated:
            parts.append(f"<p>Fix: {escape(PHASE_FIX[top])}.</p>")
    parts.append(
        f"<p>Reserved {escape(fmt_bytes(r.get('reserved')))}, allocated {escape(fmt_bytes(allocated))}; "
        f"free inside reserved {escape(fmt_bytes(r.get('reserved_free')))} "
        f"({(r.get('fragmentation_share') or 0.0):.0%}), largest free block "
        f"{escape(fmt_bytes(r.get('largest_free')))}.</p>"
    )
    if r.get("expandable_segments_advised"):
        parts.append(
            "<p>Fix: <code>PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True</code> (more than 20% of reserved "
            "memory is free but fragmented).</p>"
        )
    return Section(id="verdict", title="Verdict", body="".join(parts))


def sections(r: dict[str, Any]) -> list[Section]:
    """The page's sections for :func:`~torchscalpel.memory.snapshot.explain_snapshot`'s result."""
    out = [_verdict(r)]
    mib = 1024**2
    phases = {k: v for k, v in (r.get("phases") or {}).items() if v}
    trace = r.get("trace") or {}
    peak = (
        f"<p>The trace has {trace['events']} allocator events; live bytes peaked "
        f"{escape(fmt_bytes(trace.get('peak_live')))} above its start (event {trace.get('peak_at_event')}).</p>"
        if trace.get("events")
        else "<p>The snapshot holds no allocator trace (record_memory_history was off).</p>"
    )
    body = peak + _timeline(trace)
    if phases:
        body += charts.stacked_bars(
            "snapshot-phases",
            ["allocated"],
            {PHASE_WORDS.get(k, k): [v / mib] for k, v in phases.items()},
            unit="MiB",
            x_title="the snapshot",
            y_title="allocated (MiB)",
        )
    out.append(Section(id="phases", title="Allocated by phase", body=body))
    sites = r.get("sites") or []
    out.append(
        Section(
            id="sites",
            title="Allocated by call site",
            body=table(
                ["call site", "bytes"], [[s["name"], fmt_bytes(s["bytes"])] for s in sites], [False, True]
            )
            if sites
            else "<p>No call sites: the snapshot was taken without stacks.</p>",
        )
    )
    largest = r.get("largest") or []
    out.append(
        Section(
            id="largest",
            title="Largest live blocks",
            body=table(
                ["bytes", "call site"], [[fmt_bytes(b["bytes"]), b["site"]] for b in largest], [True, False]
            )
            if largest
            else "<p>No live blocks.</p>",
        )
    )
    reader = "native streaming reader" if r.get("reader") == "native" else "pure-Python reader"
    out.append(
        Section(
            id="snapshot",
            title="The snapshot",
            body=f"<p>{escape(str(r.get('path')))}: {r.get('segments')} segments, {r.get('blocks')} live blocks; "
            f"read by the {reader} in {(r.get('read_s') or 0.0):.2f} s.</p>",
        )
    )
    return out


def render(r: dict[str, Any]) -> str:
    """The whole page."""
    return render_page("scalpel memory: snapshot", str(r.get("path", "")), sections(r))


def write_snapshot_page(r: dict[str, Any], path: Path) -> Path:
    """Write :func:`render`'s page to ``path`` (atomically) and return it."""
    atomic_write_text(path, render(r))
    return path

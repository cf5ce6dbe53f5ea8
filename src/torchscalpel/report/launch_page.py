"""The HTML page of a launch (``OUT/launch.html``, and ``scalpel report OUT/launch.json``): one
self-contained page built from ``launch.json``. The verdict leads: the hang or collective mismatch when
the hang watch saw one, the straggler when the rule calls one (else why not), the communication-bound or
per-rank-batch verdict with its evidence and fix, the findings' count;
then the ranks side by side, their step times as bars, and the findings with the ranks that raised them."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from torchscalpel.fileio import atomic_write_text
from torchscalpel.report import charts
from torchscalpel.report.html import render_page
from torchscalpel.report.page import Section, table

WATCH_RULES = ("rank-hang", "collective-mismatch")
"""Findings of the hang watch: when present they are the launch's verdict."""


def is_launch_summary(data: object) -> bool:
    """Whether ``data`` (a parsed JSON file) is a ``launch.json``: ranks, findings, no record schema."""
    return isinstance(data, dict) and "ranks" in data and "findings" in data and "schema_version" not in data


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _verdict(merged: dict[str, Any]) -> Section:
    parts: list[str] = []
    findings = merged.get("findings") or []
    for f in findings:
        if f.get("rule") in WATCH_RULES:
            ranks = ", ".join(str(r) for r in f.get("ranks") or [])
            evidence = "".join(f"<li>{escape(str(e))}</li>" for e in f.get("evidence") or [])
            parts.append(
                f'<p class="sev-error"><b>{escape(str(f.get("message", "")))}</b>'
                + (f" (ranks {escape(ranks)})" if ranks else "")
                + f"</p><ul>{evidence}</ul><p>Fix: {escape(str(f.get('fix', '')))}</p>"
            )
    verdict = merged.get("straggler_verdict") or {}
    if verdict.get("sentence"):
        parts.append(f"<p>Straggler: {escape(str(verdict['sentence']))}</p>")
    for v in merged.get("verdicts") or []:  # why the multi-rank step is slow (communication, the batch split)
        evidence = "".join(f"<li>{escape(str(e))}</li>" for e in v.get("evidence") or [])
        parts.append(
            f'<p class="sev-warning"><b>{escape(str(v.get("message", "")))}</b> '
            f"<code>{escape(str(v.get('rule', '')))}</code></p><ul>{evidence}</ul>"
            + (f"<p>Fix:</p><pre>{escape(str(v['fix']))}</pre>" if v.get("fix") else "")
        )
    rows = merged.get("ranks") or []
    if rows:
        states = sorted({str(r.get("status")) for r in rows})
        parts.append(f"<p>{len(rows)} rank(s) wrote a record; status {escape(', '.join(states))}.</p>")
    else:
        parts.append("<p>No rank wrote a run record.</p>")
    others = [f for f in findings if f.get("rule") not in WATCH_RULES]
    if others:
        parts.append(f'<p>{len(others)} other finding(s) below (<a href="#findings">findings</a>).</p>')
    return Section(id="verdict", title="Verdict", body="".join(parts))


def sections(merged: dict[str, Any]) -> list[Section]:
    """The page's sections for a ``launch.json`` dict."""
    from torchscalpel.distributed.rankmerge import STEP_TIME_MEANS

    out = [_verdict(merged)]
    rows = merged.get("ranks") or []
    if rows:
        body = (
            table(
                ["rank", "status", "steps", "step ms", "collective ms", "compute ms", "data ms"],
                [
                    [
                        r.get("rank"),
                        r.get("status"),
                        r.get("steps"),
                        _ms(r.get("step_ms")),
                        _ms(r.get("collective_ms")),
                        _ms(r.get("compute_ms")),
                        _ms(r.get("data_ms")),
                    ]
                    for r in rows
                ],
                [True, False, True, True, True, True, True],
            )
            + f'<p class="muted">{escape(STEP_TIME_MEANS)}</p>'
        )
        split = {
            "compute": [r.get("compute_ms") for r in rows],
            "collectives": [r.get("collective_ms") for r in rows],
        }
        if all(v is not None for values in split.values() for v in values):
            body += charts.stacked_bars(
                "launch-ranks",
                [f"rank {r.get('rank')}" for r in rows],
                {k: [float(v) for v in values if v is not None] for k, values in split.items()},
                unit="ms",
                x_title="rank",
                y_title="per profiled step (ms)",
            )
        out.append(Section(id="ranks", title="Ranks side by side", body=body))
    findings = merged.get("findings") or []
    if findings:
        items = "".join(
            f'<h3><span class="sev-{escape(str(f.get("severity", "info")))}">'
            f"{escape(str(f.get('severity', 'info')).upper())}</span> <code>{escape(str(f.get('rule')))}</code>"
            f' <span class="muted">(ranks {escape(", ".join(str(r) for r in f.get("ranks") or []))})</span></h3>'
            f"<p>{escape(str(f.get('message', '')))}</p>"
            + (f"<pre>{escape(str(f['fix']))}</pre>" if f.get("fix") else "")
            for f in findings
        )
        out.append(Section(id="findings", title=f"Findings ({len(findings)})", body=items))
    return out


def render(merged: dict[str, Any], *, subtitle: str = "") -> str:
    """The whole page."""
    return render_page("scalpel launch", subtitle, sections(merged))


def write_launch_page(merged: dict[str, Any], path: Path, *, subtitle: str = "") -> Path:
    """Write :func:`render`'s page to ``path`` (atomically) and return it."""
    atomic_write_text(path, render(merged, subtitle=subtitle))
    return path

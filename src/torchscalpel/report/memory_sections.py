"""HTML report section for ``scalpel memory``: reads ``record.sections["memory"]`` (never measures).

Live memory by category at each step end (stacked), the peak broken down by category, module and call
site, growth, and the out-of-memory post-mortem with its fix ladder.
"""

from __future__ import annotations

from html import escape
from typing import Any

from torchscalpel.record import RunRecord
from torchscalpel.report.charts import stacked_bars
from torchscalpel.report.page import Section, table
from torchscalpel.runtime.memory_categories import CATEGORIES
from torchscalpel.sections import MemorySection
from torchscalpel.units import fmt_bytes

_NAMES = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
    "temporaries": "temporaries",
}


def build(record: RunRecord) -> list[Section]:
    """One "Memory" section (none when the record holds no memory section)."""
    m = record.section(MemorySection)
    if m is None:
        return []
    if m.peak is None or "by_category" not in m.peak:
        said = m.error if m.error is not None else "no memory data"
        return [Section(id="memory", title="Memory", body=f"<p>{escape(str(said))}</p>")]
    peak_total = m.peak.get("total")
    # the charts' unit from the peak: a small run's 28 KiB read as 0.00 MiB in every row
    unit, mib = (
        ("KiB", 1024.0)
        if isinstance(peak_total, (int, float)) and peak_total < 1024**2
        else ("MiB", 1024.0**2)
    )
    # The verdict first (the peak, the out-of-memory cause and its fix ladder, growth): it sat ~900 px
    # down, below two charts. The charts and tables follow in their own section.
    verdict: list[str] = []
    parts: list[str] = []
    peak = m.peak
    oom = m.oom
    if oom:
        verdict.append(_oom(oom, m))
    sentence = m.verdict  # the terminal's sentence (one definition: the view's)
    if sentence:
        said = sentence.removeprefix("verdict: ")
        verdict.append(f"<p><b>{escape(said[:1].upper() + said[1:])}.</b></p>")
    verdict.append(
        f"<h3>At the peak: {escape(fmt_bytes(peak.get('total')))}</h3><p>step {escape(str(peak.get('step')))}, "
        f"{escape(str(peak.get('phase')))}, at <code>{escape(str(peak.get('op')))}</code></p>"
    )
    note = (m.evaluation or {}).get("note")
    if note:
        verdict.append(f"<p><b>{escape(str(note))}.</b></p>")
    before = m.before_training
    if before:
        verdict.append(
            f"<p>Before training the live total was higher: {escape(fmt_bytes(before.get('total')))} at "
            f"<code>{escape(str(before.get('site')))}</code> (loading data or building the model).</p>"
        )
    growth = m.growth or {}
    if growth.get("per_step"):
        verdict.append(
            f"<h3>Growth: {escape(fmt_bytes(growth['per_step']))} per step</h3>"
            + (
                (
                    f"<p>{growth['steps_left']} more steps until {escape(fmt_bytes(growth.get('capacity')))}</p>"
                    if growth["steps_left"]
                    else f"<p>It reached {escape(fmt_bytes(growth.get('capacity')))} in this run.</p>"
                )
                if growth.get("steps_left") is not None
                else ""
            )
        )
    samples = m.samples or []
    if samples:
        labels = [f"step {s['step']}" for s in samples][-40:]
        series = {_NAMES[c]: [s["by_category"].get(c, 0) / mib for s in samples][-40:] for c in CATEGORIES}
        # The peak is inside a step, above the step-end totals: drawn as its own line where the verdict says
        total = peak.get("total")
        drawn = (
            (
                float(total) / mib,
                f"peak {fmt_bytes(total)} (step {peak.get('step')}, {peak.get('phase')})",
                f"step {peak.get('step')}",
            )
            if isinstance(total, (int, float)) and total > 0
            else None
        )
        parts.append(
            "<h3>Live memory at each step end, and the peak</h3>"
            + stacked_bars("memory-steps", labels, series, unit=unit, peak=drawn)
        )
    parts.append(
        "<h3>At the peak, by kind</h3>"
        + stacked_bars(
            "memory-peak",
            ["peak"],
            {_NAMES[c]: [peak["by_category"].get(c, 0) / mib] for c in CATEGORIES},
            unit=unit,
        )
    )
    parts.append(
        table(
            ["activations saved by module", "bytes"],
            [[r["name"] or "(outside any module)", fmt_bytes(r["bytes"])] for r in peak.get("modules", [])],
            numeric=[False, True],
        )
    )
    parts.append(
        table(
            ["live at the peak, by call site", "bytes"],
            [[r["name"], fmt_bytes(r["bytes"])] for r in peak.get("sites", [])],
            numeric=[False, True],
        )
    )
    if growth.get("sites"):
        parts.append(
            table(
                ["growing site", "per step", "live"],
                [
                    [r["site"], fmt_bytes(r["per_step"]), fmt_bytes(r["live"])]
                    for r in growth.get("sites", [])
                ],
                numeric=[False, True, True],
            )
        )
    target = getattr(record, "target", None) or {}  # a record written in-process may name no script
    script = target.get("script") or (f"-m {target['module']}" if target.get("module") else "")
    if script:
        # the page sits in the run folder it names: RUN_DIR stands for it
        verdict.append(f"<p>{escape('N' + m.next_step(str(script), 'RUN_DIR')[1:])}</p>")
    return [
        Section(
            id="memory",
            title="Memory: the peak" + (" and the out-of-memory fix" if oom else ""),
            body="".join(verdict),
        ),
        Section(id="memory-detail", title="Memory: over the steps and at the peak", body="".join(parts)),
    ]


def _oom(oom: dict[str, Any], m: MemorySection) -> str:
    req = oom["request"]
    head = (
        f"<h3>Out of memory</h3><p><code>{escape(str(req.get('op')))}</code> at <code>{escape(str(req.get('site')))}"
        f"</code> asked for {escape(fmt_bytes(req.get('bytes')))} with {escape(fmt_bytes(oom.get('live')))} live "
        f"(limit {escape(fmt_bytes(oom.get('limit')))}). Top cause: <b>{escape((m.top_cause or {}).get('text', '?'))}</b>.</p>"
    )
    rows = [
        [
            r["action"],
            fmt_bytes(r["saves"]) if r.get("saves") else "-",
            {True: "yes", False: "no", None: "?"}[r.get("fits")],
            ", ".join(f"{k} = {v}" for k, v in r.get("config", {}).items()) or "-",
        ]
        for r in oom.get("ladder", [])
    ]
    return head + table(
        ["fix", "saves", "fits", "scalpel.toml [tune]"], rows, numeric=[False, True, False, False]
    )

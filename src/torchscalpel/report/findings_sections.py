"""The report's Findings section, built from ``record.findings`` (doctor rules and env checks)."""

from __future__ import annotations

from html import escape

from torchscalpel.findings import location_text
from torchscalpel.record import RunRecord
from torchscalpel.report.page import Section
from torchscalpel.sections import DoctorSection

_ORDER = {"error": 0, "warning": 1, "info": 2}


def build(record: RunRecord) -> list[Section]:
    """One section listing every finding, most severe first; none when the record has no findings
    and doctor did not run."""
    findings = sorted(
        record.findings, key=lambda f: (_ORDER.get(str(f.get("severity")), 3), f.get("rule", ""))
    )
    if not findings:
        if record.section(DoctorSection) is None:
            return []
        return [Section(id="findings", title="Findings", body="<p>No findings: every rule passed.</p>")]
    counts = {k: sum(1 for f in findings if f.get("severity") == k) for k in _ORDER}
    parts = [
        '<div class="kpis">'
        + "".join(f'<div class="kpi"><b class="sev-{k}">{n}</b>{k}</div>' for k, n in counts.items())
        + "</div>"
    ]
    for f in findings:
        sev = escape(str(f.get("severity", "info")))
        loc = f.get("location")
        where = (
            f' <span class="muted">{escape(location_text(loc["file"], int(loc["line"])))}</span>'
            if loc
            else ""
        )
        rank = f' <span class="muted">(rank {int(f["rank"])})</span>' if f.get("rank") is not None else ""
        evidence = "".join(f"<li>{escape(str(e))}</li>" for e in f.get("evidence", []))
        fix = f"<pre>{escape(f['fix'])}</pre>" if f.get("fix") else ""
        parts.append(
            f'<h3><span class="sev-{sev}">{sev.upper()}</span> <code>{escape(str(f.get("rule")))}</code>{where}{rank}</h3>'
            f"<p>{escape(str(f.get('message', '')))}</p><ul>{evidence}</ul>{fix}"
        )
    return [Section(id="findings", title=f"Findings ({len(findings)})", body="\n".join(parts))]

"""The "Environment" section of the HTML report: the record's environment facts as a table."""

from __future__ import annotations

from torchscalpel.record import RunRecord
from torchscalpel.report.env_terminal import fact_rows
from torchscalpel.report.page import Section, table


def build(record: RunRecord) -> list[Section]:
    """One section listing what :func:`torchscalpel.envcheck.facts.collect_facts` recorded (none if empty)."""
    if not record.environment:
        return []
    body = table(["", ""], fact_rows(record.environment))
    note = '<p class="muted">Run <code>scalpel env</code> on this machine for compatibility checks and probes.</p>'
    return [Section(id="environment", title="Environment", body=body + note)]

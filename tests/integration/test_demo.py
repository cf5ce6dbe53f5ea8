"""``scalpel demo``: stages into one folder and one combined report."""

from __future__ import annotations

import pytest

from helpers import assert_training_breakdown, run_cli
from torchscalpel.record import load_record


@pytest.mark.slow
def test_demo_runs_the_chosen_stages_and_writes_one_report(tmp_path):
    out = tmp_path / "demo"
    proc = run_cli("demo", "--out", str(out), "--steps", "4", "--stages", "env,profile,analyze,plan", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = load_record(out / "profile")
    assert_training_breakdown(record)
    assert (out / "analyze" / "analysis.json").exists()
    assert (out / "env" / "env.json").exists()
    html = (out / "report.html").read_text()
    for section in ('id="demo-stages"', 'id="steps"', 'data-chart="step-breakdown"'):
        assert section in html
    assert "plan" in load_record(out / "plan").sections
    assert 'id="plan' in html
    assert "FAILED" not in html


def test_unknown_demo_stage_is_a_usage_error():
    proc = run_cli("demo", "--stages", "profile,teleport")
    assert proc.returncode == 2
    assert "Unknown demo stage(s) teleport" in proc.stderr

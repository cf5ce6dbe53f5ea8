"""``scalpel demo``: stages into one folder and one combined report."""

from __future__ import annotations

import pytest

from helpers import assert_training_breakdown, run_cli
from torchscalpel.record import load_record


@pytest.mark.slow
def test_demo_runs_the_chosen_stages_and_writes_one_report(tmp_path):
    out = tmp_path / "demo"
    proc = run_cli(
        "demo", "--out", str(out), "--steps", "4", "--stages", "env,profile,analyze,plan", timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = load_record(out / "profile")
    assert_training_breakdown(record)
    assert (out / "analyze" / "analysis.json").exists()
    assert "analyze: reading the profile's trace trace.json.gz (" in proc.stderr  # it printed nothing
    assert "analyze: writing analysis.json and report.html: done (" in proc.stderr
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


def test_ship_stage_without_its_extras_is_skipped_with_the_install_command(tmp_path, monkeypatch):
    from torchscalpel.cli.common import Target
    from torchscalpel.report.demo_terminal import result_word
    from torchscalpel.stages import demo

    monkeypatch.setattr(demo, "SHIP_MODULES", {"torchscalpel_no_such_module": "nosuchdist"})
    ok, _, summary = demo._ship(
        Target(script=tmp_path / "char_transformer.py", args=[]), tmp_path, demo.DemoOptions(out=tmp_path)
    )
    assert ok and summary == 'skipped: needs nosuchdist (pip install "torchscalpel[all]")'
    assert result_word(demo.StageResult("ship", ok, 0.0, "", summary)) == "skipped"


def test_bundled_examples_are_the_checkout_ones_and_copy_out(tmp_path):
    from helpers import REPO
    from torchscalpel.errors import UsageError
    from torchscalpel.examples import EXAMPLES_DIR, NAMES, copy_examples, example_script

    assert (REPO / "examples").resolve() == EXAMPLES_DIR  # through src/torchscalpel/example_scripts
    assert sorted(NAMES) == sorted(p.name for p in (REPO / "examples").glob("*.py"))
    dest = copy_examples(tmp_path / "ex")
    for name in NAMES:
        assert (dest / name).read_bytes() == example_script(name).read_bytes()
    with pytest.raises(UsageError, match=r"no bundled example nope\.py"):
        example_script("nope.py")

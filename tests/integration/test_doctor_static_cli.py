"""``doctor --static`` from the command line on files it cannot read (issue 19, item 13): a syntax error is
NOT ANALYSED with its line and fails a CI gate, a pathological file is never a traceback, a clean file still
says "No findings." (the in-process checks are in tests/unit/test_doctor_static_hardening.py)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_cli


def test_cli_says_not_analysed_and_a_ci_gate_fails(tmp_path: Path) -> None:
    f = tmp_path / "broken.py"
    f.write_text("x = (1\n")
    out = tmp_path / "d.json"
    proc = run_cli("doctor", "--static", str(f), "--fail-on", "error", "--json", str(out), timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NOT ANALYSED" in proc.stdout and "No findings." not in proc.stdout
    assert "broken.py:1" in proc.stdout.replace("\n", "")
    doc = json.loads(out.read_text())
    assert doc["not_analysed"][0]["line"] == 1


def test_a_200k_term_expression_is_not_analysed_not_a_traceback(tmp_path: Path) -> None:
    f = tmp_path / "terms.py"
    f.write_text("x = " + "+".join(["1"] * 200_000) + "\n")
    proc = run_cli("doctor", "--static", str(f), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "NOT ANALYSED" in proc.stdout and "too deeply" in proc.stdout


def test_clean_file_still_says_no_findings(tmp_path: Path) -> None:
    f = tmp_path / "ok.py"
    f.write_text("x = 1\n")
    proc = run_cli("doctor", "--static", str(f), timeout=120)
    assert proc.returncode == 0 and "No findings." in proc.stdout and "NOT ANALYSED" not in proc.stdout

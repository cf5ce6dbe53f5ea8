"""``scalpel analyze`` on hostile traces (issue 19, item 12): deep nesting is one line and no traceback, absurd
times are left out and counted, ``--json`` never writes a bare NaN, a full disk is one sentence. Moved from
tests/unit/test_trace_hardening.py, which reads the same traces in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli
from trace_builders import bad_times_trace, deeply_nested_trace, op_event, write_events


def test_analyze_on_deeply_nested_args_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    proc = run_cli("analyze", str(deeply_nested_trace(tmp_path / "deep.json")), timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_analyze_json_never_holds_a_bare_nan(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    proc = run_cli("analyze", str(bad_times_trace(tmp_path)), "--json", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "6 invalid event(s) left out" in proc.stdout

    def refuse(name: str) -> None:
        raise AssertionError(f"bare {name} in --json output")

    json.loads(out.read_text(), parse_constant=refuse)


def test_analyze_json_to_a_full_device_is_one_sentence(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    proc = run_cli(
        "analyze", str(write_events(tmp_path / "ok.json", [op_event(0)])), "--json", "/dev/full", timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "/dev/full" in proc.stderr

"""The profiler window and the op-line pass are two torch.profiler sessions: no profiler range may start
under the first and end under the second.

Such a range's end is written into the first session's events, freed when it stopped (torch 2.13): the
heap corruption made ``scalpel profile`` of the epoch loop die with SIGSEGV in the pass's ``prof.stop()``,
before run.json was written and with nothing on the terminal (2 of 30 runs, 0 of 30 after). The
optimizer's ``Optimizer.step#...`` range is open around the step-end hook that closes the window, so the
pass must not start there. The crash itself depends on the heap's layout; the crossing it needs does not.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_cli

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"


def test_no_profiler_range_crosses_from_the_window_into_the_op_line_pass(tmp_path):
    out, log = tmp_path / "run", tmp_path / "ranges.log"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--warmup",
        "1",
        "--steps",
        "6",
        "--profile-steps",
        "2",
        "--no-report",
        "--",
        str(SCRIPTS / "range_sessions.py"),
        RANGE_LOG=str(log),
    )
    assert proc.returncode == 0, proc.stderr[-2000:] + (out / "scalpel.log").read_text()
    record = json.loads((out / "run.json").read_text())
    assert record["profiler"]["steps"] == [2, 3]
    assert log.read_text() == ""
    assert record["profiler"]["op_lines"]["steps"] == [5]  # the pass ran, one step after the window

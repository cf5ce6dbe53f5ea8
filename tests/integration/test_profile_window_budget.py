"""The profiler window's size budget, on a time_sequence_prediction-style script (LBFGS closures over an
unrolled float64 LSTMCell): the full-size script once grew the window to 5 GiB and never wrote run.json."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from helpers import run_cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "witness" / "lbfgs_lstm.py"
SCRIPT_ARGS = ["--timesteps", "20", "--max-iter", "10", "--steps", "8"]


def _profile(tmp_path: Path, *flags: str) -> tuple[dict, str, int]:
    out = tmp_path / "run"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--warmup",
        "1",
        "--steps",
        "4",
        "--no-report",
        *flags,
        "--",
        str(FIXTURE),
        *SCRIPT_ARGS,
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "run.json").read_text())
    with gzip.open(out / "trace.json.gz") as fh:
        events = len(json.loads(fh.read())["traceEvents"])
    return record, proc.stderr, events


@pytest.mark.slow
def test_a_window_over_budget_covers_fewer_steps_and_says_so(tmp_path):
    record, stderr, events = _profile(tmp_path)  # defaults: 3 profiled steps asked, 200k events allowed
    profiler = record["profiler"]
    assert profiler["bounded"].startswith("the profiler window covers 1 step(s), not 3"), profiler
    assert profiler["steps"] == [2] and profiler["event_budget"] == 200_000
    assert 3 * profiler["events_per_step_estimate"] > 200_000 >= profiler["events_per_step_estimate"]
    assert events <= 1.25 * 200_000
    assert "the profiler window covers 1 step(s), not 3" in stderr
    assert record["summary"]["median_step_ms"] is not None and record["summary"]["flops_per_step"] > 0


@pytest.mark.slow
def test_a_step_the_window_cannot_hold_is_cut_short_and_the_run_finishes(tmp_path):
    budget = 30_000
    record, stderr, events = _profile(tmp_path, "--profile-budget", str(budget))
    profiler = record["profiler"]
    cut = re.search(r"cut short after (\d+) of its (\d+) backward calls", profiler["bounded"])
    assert cut and 1 <= int(cut[1]) < int(cut[2]), profiler["bounded"]
    assert "without shapes and memory" in profiler["bounded"]
    assert profiler["events_per_step_estimate"] > budget
    assert profiler["steps"] == [2] and [s["index"] for s in record["steps"] if s["profiled"]] == [1, 2]
    assert events <= 1.5 * budget, events  # the profiler stopped near the budget, mid-step
    assert "cut short after" in stderr
    assert record["status"] == "stopped" and len(record["steps"]) == 5

"""Both bundled examples under the profiler window: trace, op summary, FLOPs, module times."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from helpers import assert_training_breakdown, run_cli
from torchscalpel.record import load_record

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("digits_cnn.py", ["--epochs", "1"]),
        (
            "char_transformer.py",
            ["--steps", "40", "--dim", "64", "--layers", "2", "--corpus-chars", "200000"],
        ),
    ],
)
def test_example_profile_writes_trace_record_and_report(tmp_path, script, args):
    out = tmp_path / "run"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--warmup",
        "2",
        "--steps",
        "6",
        "--profile-steps",
        "2",
        "--module-times",
        "--",
        str(EXAMPLES / script),
        *args,
    )
    assert proc.returncode == 0, proc.stderr
    record = load_record(out)
    assert record.status == "stopped" and len(record.measured_steps) == 6
    assert_training_breakdown(record)
    assert record.profiler["steps"] == [3, 4]
    # step 2 is the FLOP-counting step and step 6 the op-line pass (one step after the window, whose
    # ranges must end first): instrumented too, and so left out of the timings
    assert [s.index for s in record.steps if s.profiled] == [2, 3, 4, 6]
    assert [s.index for s in record.steps if s.op_lines] == record.profiler["op_lines"]["steps"] == [6]
    assert [s.index for s in record.steps if s.flops_counted] == [record.profiler["flops_step"]] == [2]
    assert record.profiler["flops_total"] > 0 and record.summary["achieved_flops_per_s"] > 0
    # the op summary is stored once, in the trace section
    assert (
        "top_ops" not in record.profiler
        and record.op_summary()["top_ops"] == record.sections["trace"]["top_ops"]
    )
    with gzip.open(out / "trace.json.gz") as fh:
        trace = json.loads(fh.read())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"ProfilerStep#3", "ProfilerStep#4"} <= names
    assert record.modules and record.modules[0]["forward_ms"] >= record.modules[-1]["forward_ms"]
    assert "step time: median" in proc.stderr

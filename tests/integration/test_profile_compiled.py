"""``scalpel profile`` on a script that runs ``model = torch.compile(model)``: the measured steps run the
compiled code, as they do under plain python.

Found at the end of a work round: the FLOP-counting step's dispatch mode made dynamo refuse the compiled
frame and mark its code "skip" for the rest of the process, so every later step (the profiler window
included) ran eagerly: eager backward nodes (``ViewBackward0``) and no ``Torch-Compiled Region`` in the
trace, step times that were eager times. backend="aot_eager" keeps the test cheap: dynamo and AOTAutograd
run as with inductor, without inductor's C++ compile."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_cli

COMPILED = Path(__file__).resolve().parents[1] / "fixtures" / "op_patterns" / "compiled_attention.py"


def test_the_profiler_window_measures_the_compiled_model(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--steps",
        "6",
        "--no-report",
        "--no-op-lines",
        "--",
        str(COMPILED),
        "--backend",
        "aot_eager",
        OMP_NUM_THREADS="1",
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "run.json").read_text())
    window = record["profiler"]["steps"]
    assert window and record["profiler"]["flops_step"] < window[0]  # the counted step came first
    calls = {op["name"]: op["count"] for op in record["sections"]["trace"]["top_ops"]}
    compiled = {name: n for name, n in calls.items() if name.startswith("Torch-Compiled Region")}
    # one compiled forward and one compiled backward per profiled step, and no eager autograd node
    assert sum(compiled.values()) == len(window), (
        f"no compiled region in the profiler window: {sorted(calls)}"
    )
    assert calls.get("CompiledFunction") == calls.get("CompiledFunctionBackward") == len(window), calls
    assert "ViewBackward0" not in calls, "the compiled model's backward ran eagerly in the profiler window"


def test_memory_says_the_compiled_model_was_measured_eagerly(tmp_path):
    """The allocation tracker is a dispatch mode over the whole run, so dynamo runs no compiled code under it:
    the figures are the eager model's and the output says so instead of passing them off as the compiled one's."""
    out = tmp_path / "mem"
    proc = run_cli(
        "memory",
        "--out",
        str(out),
        "--steps",
        "2",
        "--no-report",
        "--",
        str(COMPILED),
        "--backend",
        "aot_eager",
    )
    assert proc.returncode == 0, proc.stderr
    section = json.loads((out / "run.json").read_text())["sections"]["memory"]
    assert "ran eagerly under the memory tracker" in section.get("compiled", ""), sorted(section)
    assert "note: the model is torch.compile'd but ran eagerly" in proc.stdout

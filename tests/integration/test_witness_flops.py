"""Witness for FLOPs per step: the record's figure against FlopCounterMode over the same training step.

Before the FLOP-counting step, the record read torch.profiler's ``with_flops`` averages, which count
no backward op and, under autocast, each forward op twice.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from helpers import run_cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "witness" / "flops_cnn.py"


def _fixture():
    spec = importlib.util.spec_from_file_location("flops_cnn_witness", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _counted(argv: list[str]) -> int:
    """FlopCounterMode's count of one training step of the fixture run with ``argv``."""
    return _fixture().counted_flops(argv)


def _profile(tmp_path: Path, argv: list[str]) -> dict:
    out = tmp_path / "run"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--warmup",
        "2",
        "--steps",
        "5",
        "--profile-steps",
        "1",
        "--no-report",
        "--",
        str(FIXTURE),
        *argv,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "run.json").read_text())


@pytest.mark.slow
@pytest.mark.filterwarnings(
    "ignore:Using `torch.compile"
)  # FlopCounterMode's own module hooks, in this process
@pytest.mark.parametrize(
    "argv", [[], ["--amp"], ["--compile", "aot_eager"]], ids=["fp32", "bf16-autocast", "compiled"]
)
def test_flops_per_step_equal_flop_counter_mode_over_the_same_step(tmp_path, argv):
    record = _profile(tmp_path, argv)
    expected = _counted(argv)
    summary, profiler = record["summary"], record["profiler"]
    assert summary["flops_per_step"] == pytest.approx(expected, rel=0.02), (
        summary["flops_per_step"],
        expected,
    )
    # the total is the sum over ops, and backward ops are among them
    assert profiler["flops_total"] == sum(op["flops"] for op in profiler["flops_by_op"])
    assert any("backward" in op["name"] for op in profiler["flops_by_op"])
    assert summary["achieved_flops_per_s"] == pytest.approx(
        summary["flops_per_step"] / (summary["median_step_ms"] / 1000)
    )
    # the counted step is left out of the timings, like profiled steps
    counted = [s for s in record["steps"] if s["flops_counted"]]
    assert [s["index"] for s in counted] == [profiler["flops_step"]] and counted[0]["profiled"]
    assert summary["steps_summarized"] == 5 - 1 - 1 - 1  # and the op-line pass's step


@pytest.mark.slow
def test_checkpoint_recompute_is_counted_once_apart_from_model_flops(tmp_path):
    record = _profile(tmp_path, ["--checkpoint"])
    summary = record["summary"]
    model_flops, with_recompute = _counted([]), _counted(["--checkpoint"])
    assert with_recompute > model_flops  # the witness itself sees the recomputation
    assert summary["flops_per_step"] == pytest.approx(model_flops, rel=0.02)
    assert summary["recompute_flops_per_step"] == pytest.approx(with_recompute - model_flops, rel=0.02)
    assert record["profiler"]["flops_recompute"] == sum(
        op["recompute"] for op in record["profiler"]["flops_by_op"]
    )


@pytest.mark.slow
def test_a_run_with_no_step_left_for_counting_says_not_measured(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--warmup",
        "1",
        "--steps",
        "2",
        "--profile-steps",
        "2",
        "--no-report",
        "--",
        str(FIXTURE),
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "run.json").read_text())
    assert (
        record["summary"].get("flops_per_step") is None
        and record["summary"].get("achieved_flops_per_s") is None
    )
    assert "--steps 3" in record["summary"]["flops_not_measured"]
    assert "FLOPs: not measured: no measured step was left for counting" in proc.stderr

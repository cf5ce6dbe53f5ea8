"""Witness for FLOPs per step on scripts that evaluate between training steps and on an LSTM language model:
the record's figure against FlopCounterMode over exactly one training step (no evaluation forward in it),
and against the same recurrence written with matmuls where torch has no formula for the fused kernel.

Before: the FLOP-counting step ran from the previous step's end to its own, so a ``test()`` forward after
each step (pytorch/examples gcn, time_sequence_prediction) was added to the step's FLOPs; ``nn.LSTM`` on CPU
(``aten::mkldnn_rnn_layer``) counted nothing, silently."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from helpers import run_cli

WITNESS = Path(__file__).resolve().parents[1] / "fixtures" / "witness"


def _fixture(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_witness", WITNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _profile(tmp_path: Path, name: str, argv: list[str], steps: str = "4") -> tuple[dict, str]:
    out = tmp_path / "run"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--warmup",
        "1",
        "--steps",
        steps,
        "--profile-steps",
        "1",
        "--no-report",
        "--",
        str(WITNESS / f"{name}.py"),
        *argv,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "run.json").read_text()), proc.stdout + proc.stderr


@pytest.mark.slow
def test_gcn_test_forwards_between_steps_are_not_step_flops(tmp_path):
    record, _ = _profile(tmp_path, "gcn_eval", [], steps="6")
    expected = _fixture("gcn_eval").counted_flops([])
    summary, profiler = record["summary"], record["profiler"]
    assert profiler["flops_step"] == 1
    assert summary["flops_per_step"] == expected, (summary["flops_per_step"], expected)
    # the two test() forwards after step 0 ran inside the counted window: counted apart, each a forward
    # (the training step is a forward and a backward of the same matmuls)
    assert summary["eval_flops"] == profiler["flops_eval"] > 0
    assert profiler["flops_total"] == sum(op["flops"] for op in profiler["flops_by_op"])
    # their time is in each step's "other": FLOP/s is over the step less it
    timed = [s for s in record["steps"] if not s["warmup"] and not s["profiled"]]
    assert timed and all(s["eval_ms"] > 0 for s in timed)
    assert summary["training_step_ms"] < summary["median_step_ms"]
    assert summary["achieved_flops_per_s"] == pytest.approx(expected / (summary["training_step_ms"] / 1000))


@pytest.mark.slow
def test_gcn_on_a_sparse_adjacency_names_the_kernel_with_no_formula(tmp_path):
    record, out = _profile(tmp_path, "gcn_eval", ["--sparse"])
    rows = record["summary"]["flops_uncounted"]
    assert any(r["name"] == "aten::_sparse_addmm" and r["share"] > 0.03 for r in rows), rows
    assert "not counted (no FLOP formula): aten::_sparse_addmm" in out


@pytest.mark.slow
def test_lbfgs_closure_step_with_a_prediction_after_it(tmp_path):
    record, _ = _profile(tmp_path, "seq_eval", [])
    profiler = record["profiler"]
    expected = _fixture("seq_eval").counted_flops([], profiler["flops_step"])
    assert record["summary"]["flops_per_step"] == expected, (record["summary"]["flops_per_step"], expected)
    assert profiler["flops_eval"] > 0


@pytest.mark.slow
def test_lstm_language_model_flops_equal_the_recurrence_written_by_hand(tmp_path):
    record, out = _profile(tmp_path, "lstm_lm", [])
    fixture = _fixture("lstm_lm")
    by_hand = fixture.counted_flops(["--by-hand"])
    assert fixture.counted_flops([]) < by_hand  # FlopCounterMode alone misses the fused LSTM kernel
    summary, profiler = record["summary"], record["profiler"]
    assert summary["flops_per_step"] == by_hand, (summary["flops_per_step"], by_hand)
    names = {op["name"] for op in profiler["flops_by_op"]}
    assert {"aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward"} <= names
    assert not summary.get("flops_uncounted") and "not counted" not in out


@pytest.mark.slow
def test_no_step_time_from_instrumented_steps_with_steps_all(tmp_path):
    # 3 training steps, 1 warm-up: the FLOP-counting step and the profiled one take every measured step; the
    # old summary then read the step time from them
    record, out = _profile(tmp_path, "seq_eval", ["--steps", "3"], steps="all")
    summary = record["summary"]
    assert summary["steps_measured"] == 2 and summary["steps_summarized"] == 0
    assert summary.get("median_step_ms") is None
    assert "every measured step was instrumented" in summary["step_time_not_measured"]
    assert "step time: not measured: every measured step was instrumented" in out

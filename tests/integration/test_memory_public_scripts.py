"""`scalpel memory` on scripts shaped like public ones whose figures were wrong (issue 27)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import run_cli

PUBLIC = Path(__file__).resolve().parents[1] / "fixtures" / "memory" / "public"
MIB = 1024**2


def _memory(tmp_path: Path, script: str, *args: str, script_args: tuple[str, ...] = ()) -> tuple[str, dict]:
    js = tmp_path / "memory.json"
    proc = run_cli(
        "memory",
        "--no-report",
        "--out",
        str(tmp_path / "run"),
        "--json",
        str(js),
        *args,
        "--",
        str(PUBLIC / script),
        *script_args,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(js.read_text())


@pytest.mark.slow
def test_mnist_default_window_says_evaluation_was_not_seen(tmp_path):
    # train batches of 64 for 30 steps, then a test loop of batch 1000 under no_grad: the default 20-step window
    # ends before evaluation and must say so; --until-eval measures through it, where the peak is (next test)
    stdout, section = _memory(tmp_path, "mnist_eval_peak.py")
    assert section["evaluation"]["passes"] == 0
    assert "evaluation not seen" in stdout and "--until-eval" in stdout
    # the one "largest share" line names the largest category the summary printed above it
    shares = {
        m.group(1).strip(): float(m.group(2))
        for m in re.finditer(r"^  (\D+?)\s+[\d.]+ \w+\s+([\d.]+)%$", stdout, re.MULTILINE)
    }
    largest = max(shares, key=lambda k: shares[k])
    assert re.search(rf"^largest share: {re.escape(largest)}", stdout, re.MULTILINE), (largest, stdout)


@pytest.mark.slow
def test_mnist_until_eval_reports_the_test_loops_peak(tmp_path):
    stdout, section = _memory(tmp_path, "mnist_eval_peak.py", "--until-eval")
    peak = section["peak"]
    assert section["evaluation"]["passes"] == 1 and section["evaluation"]["note"] is None
    assert peak["phase"] == "evaluation" and section["evaluation"]["peak_in_evaluation"]
    # witness, tensor by tensor: in the test loop's relu(conv2(x)) at batch 1000, conv1's relu output, conv2's output
    # and its relu output are live (fp32), beside the parameters, their gradients, Adadelta's two buffers, both
    # datasets and the test batch
    params = (32 * 9 + 32) + (64 * 32 * 9 + 64) + (9216 * 128 + 128) + (128 * 10 + 10)
    activations = 1000 * (32 * 26 * 26 + 2 * 64 * 24 * 24) * 4
    data = (30 * 64 + 2 * 1000) * 28 * 28 * 4
    expected = activations + 4 * params * 4 + data
    assert abs(peak["total"] - expected) <= 0.03 * expected, (peak["total"], expected)
    assert "evaluation not seen" not in stdout


def test_fabric_module_names_are_the_models_own(tmp_path):
    # Fabric's setup() wraps the model in _FabricModule (_forward_module / _original_module): the names a user
    # reads are those of their own code
    fabric_lm = PUBLIC.parents[1] / "plan" / "fabric_lm.py"
    js = tmp_path / "memory.json"
    proc = run_cli(
        "memory",
        "--steps",
        "3",
        "--no-report",
        "--out",
        str(tmp_path / "run"),
        "--json",
        str(js),
        "--",
        str(fabric_lm),
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = json.loads(js.read_text())["peak"]
    names = [m["name"] for m in peak["modules"] + peak["blocks"]]
    assert "blocks.0 (Block)" in names and "blocks.0.attn" in names, names
    assert not [n for n in names if "_forward_module" in n or "_original_module" in n], names
    assert "_forward_module" not in proc.stdout


@pytest.mark.slow
def test_lbfgs_history_that_filled_is_not_named_growth(tmp_path):
    # 8 LBFGS steps: its history (100 pairs of float64 parameter-sized vectors) fills in ~5, then stays flat
    stdout, section = _memory(tmp_path, "lbfgs_lstmcell.py", script_args=("--steps", "8"))
    growth = section["growth"]
    assert growth["per_step"] == 0 and growth["steps_left"] is None, growth
    assert growth["stopped"]["flat_steps"] >= 3
    assert "memory grows" not in stdout and "bounded state" in stdout
    assert section["top_cause"]["key"] == "optimizer_state"
    # the figure it stays at is LBFGS's own state: 2 x 100 flat vectors + direction + previous gradient
    params = 4 * 51 * (1 + 51 + 2) + 4 * 51 * (51 + 51 + 2) + 51 + 1
    assert (
        abs(section["peak"]["by_category"]["optimizer_state"] - 202 * params * 8) <= 0.02 * 202 * params * 8
    )


def test_a_limit_crossing_has_one_step_number_everywhere(tmp_path):
    # mnist crossing 20 MiB in its first training forward: the status line, the peak line and the post-mortem
    # all name the crossing's step, 0-based as the record's steps (the peak line said "step 1" for "step 0")
    js = tmp_path / "memory.json"
    proc = run_cli(
        "memory",
        "--memory-limit",
        "20MiB",
        "--no-report",
        "--out",
        str(tmp_path / "run"),
        "--json",
        str(js),
        "--",
        str(PUBLIC / "mnist_eval_peak.py"),
        timeout=400,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    section = json.loads(js.read_text())
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    crossing = section["oom"]["request"]["step"]
    assert crossing == record["steps"][-1]["index"] == 0
    named = {int(n) for n in re.findall(r"\(step (\d+),", proc.stdout)}
    assert named == {crossing}, proc.stdout
    assert (
        section["peak"]["step"] == crossing and section["peak"]["phase"] == section["oom"]["request"]["phase"]
    )


def test_lbfgs_history_still_filling_is_bounded_not_growth(tmp_path):
    # a window that ends while LBFGS's history fills (4 steps of up to 20 pairs, history_size 100): the growth is
    # the optimizer's capped state, priced from its own settings, not "N more steps until the device is full"
    stdout, section = _memory(tmp_path, "lbfgs_lstmcell.py", "--steps", "3")
    growth = section["growth"]
    assert growth["per_step"] == 0 and growth["steps_left"] is None, growth
    bounded = growth["bounded"]
    params = 4 * 51 * (1 + 51 + 2) + 4 * 51 * (51 + 51 + 2) + 51 + 1
    assert bounded["history_size"] == 100 and bounded["cap"] == (2 * 100 + 2) * params * 8
    assert 0 < bounded["pairs"] < 100 and bounded["now"] + bounded["left"] == bounded["cap"]
    assert "memory grows" not in stdout and "not growth" in stdout
    assert section["top_cause"]["key"] != "growth"

"""`scalpel plan` end to end through the CLI: output, files, and one-sentence errors with exit 2."""

from __future__ import annotations

import json
import re

import pytest

from helpers import REPO, run_cli

FACTORY = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width=64, depth=3):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def build(width=64, depth=3):
    return Net(width, depth)


class NeedsData(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.nonzero(x).float()[:, :1].expand(-1, 4))


def needs_data():
    return NeedsData()
"""


@pytest.fixture()
def factory(tmp_path):
    path = tmp_path / "models_for_plan.py"
    path.write_text(FACTORY)
    return path


def test_factory_mode_prints_table_and_writes_json_record_and_report(factory, tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        "plan",
        "--model",
        f"{factory}:build",
        "--factory-args",
        '{"width": 128}',
        "--batch",
        "x=float32[32,128],y=int64[32]:10",
        "--world-size",
        "2",
        "--device",
        "L4",
        "--out",
        str(out),
        "--json",
        str(tmp_path / "plan.json"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    # piped: one line per strategy done, never a bar
    for k, strategy in enumerate(("ddp", "fsdp-grad-op", "fsdp-full"), 1):
        assert f"plan: {k} of 3: {strategy} done" in result.stderr, result.stderr
    for strategy in ("ddp", "fsdp-grad-op", "fsdp-full"):
        assert strategy in result.stdout
    assert "recommendation: ddp fits" in result.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [r["strategy"] for r in plan["rows"]] == ["ddp", "fsdp-grad-op", "fsdp-full"]
    assert plan["device"]["name"] == "L4" and plan["world_size"] == 2
    assert plan["measurement"]["param_bytes"] == (3 * (128 * 128 + 128) + 128 * 10 + 10) * 4
    assert all(r["fits"] and r["max_batch"] > 32 for r in plan["rows"])
    record = json.loads((out / "run.json").read_text())
    assert record["sections"]["plan"]["recommended"] == "ddp"
    assert "Memory plan" in (out / "report.html").read_text()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            ["--model", "no_such_pkg_xyz:build", "--batch", "x=float32[8,64]"],
            "--model: cannot import 'no_such_pkg_xyz' (ModuleNotFoundError",
        ),
        (["--model", "{factory}:build", "--batch", "x=float32[8,64"], "Cannot read batch entry"),
        (
            ["--model", "{factory}:build", "--batch", "x=float32[8,64]", "--device", "TPU9"],
            "Unknown device 'TPU9'",
        ),
        (["--model", "{factory}:needs_data", "--batch", "x=float32[8,4]", "--no-max-batch"], "aten.nonzero"),
    ],
    ids=["unimportable", "malformed-batch", "unknown-device", "needs-real-data"],
)
def test_user_errors_are_one_sentence_and_exit_2(factory, tmp_path, extra, needle):
    args = [a.replace("{factory}", str(factory)) for a in extra]
    result = run_cli("plan", *args, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("scalpel: error:"), result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_script_mode_through_the_cli(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        "plan",
        "--device",
        "T4",
        "--no-max-batch",
        "--out",
        str(out),
        "--json",
        str(tmp_path / "p.json"),
        "--",
        str(REPO / "examples" / "digits_cnn.py"),
        "--epochs",
        "1",
        "--batch-size",
        "32",
        "--workers",
        "0",
        "--device",
        "cpu",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["model"] == "DigitsCNN" and plan["batch_size"] == 32
    assert plan["optimizer"] == "AdamW"  # the class the script built, not the --optimizer default
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "stopped" and record["sections"]["plan"]["rows"][0]["strategy"] == "single"
    # piped: a plain line as the script runs and per strategy planned (it ran 54 s without one)
    assert "plan: running digits_cnn to its first optimizer step ..." in result.stderr
    assert "plan: 1 of 1: single done" in result.stderr


SCRIPTS = REPO / "tests" / "fixtures" / "scripts"


def test_script_mode_scales_the_batch_not_the_sequence_and_prices_no_optimizer(tmp_path):
    # word_language_model: (seq=35, batch=20) inputs, hand-written SGD; once dim 0 (35) was taken for the batch
    js = tmp_path / "p.json"
    result = run_cli(
        "plan",
        "--device-memory",
        "1GiB",
        "--out",
        str(tmp_path / "run"),
        "--json",
        str(js),
        "--",
        str(SCRIPTS / "plan_seq_first_lstm.py"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "batch dimension dim 1 of arg0, arg1_0, arg1_1 (sequence-first: LSTM" in result.stdout
    plan = json.loads(js.read_text())
    assert plan["batch_size"] == 20 and plan["optimizer"] == "none"
    assert plan["measurement"]["optim_bytes"] == 0
    (row,) = plan["rows"]
    assert row["max_batch"] and row["max_batch"] > 20


def test_script_mode_replays_a_transformers_model_called_with_keywords(tmp_path):
    js = tmp_path / "p.json"
    result = run_cli(
        "plan",
        "--device-memory",
        "1GiB",
        "--no-max-batch",
        "--out",
        str(tmp_path / "run"),
        "--json",
        str(js),
        "--",
        str(SCRIPTS / "plan_hf_kwargs.py"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(js.read_text())
    assert plan["model"] == "LlamaForCausalLM" and plan["optimizer"] == "AdamW"
    assert re.fullmatch(r"input_ids=int64\[2,16\]:\d+,labels=int64\[2,16\]:\d+", plan["batch"]), plan["batch"]

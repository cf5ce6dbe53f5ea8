"""`scalpel plan` on scripts shaped like public ones that broke it (issue 27): Lightning's demo Transformer and a
Fabric LM loop, both holding plain tensor attributes (neither parameters nor buffers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli

PLAN_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "plan"


def _plan(script: str, tmp_path: Path) -> tuple[str, str, dict]:
    out = tmp_path / "run"
    result = run_cli("plan", "--out", str(out), "--", str(PLAN_FIXTURES / script), cwd=tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, result.stderr, json.loads((out / "run.json").read_text())["sections"]["plan"]


@pytest.mark.parametrize(("script", "plain_bytes"), [
    # pe (1, 64, 32) fp32 made in forward + src_mask (12, 12) made in forward + scale () made in __init__
    ("lightning_transformer.py", (64 * 32 + 12 * 12 + 1) * 4),
    ("fabric_lm.py", 16 * 16 * 4),  # the causal mask (16, 16) fp32 made in __init__, model set up by Fabric
])
def test_plan_copies_plain_tensor_attributes_and_prints_no_torch_log(script, plain_bytes, tmp_path):
    stdout, stderr, plan = _plan(script, tmp_path)
    assert "single" in stdout and "recommendation:" in stdout
    # the model has no registered buffer: every buffer byte is a plain tensor attribute, copied shape for shape
    assert plan["measurement"]["buffer_bytes"] == plain_bytes
    assert "fake_tensor.py" not in stderr and "Traceback" not in stderr


FACTORY = '''
import torch
from torch import nn


class Mismatched(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(12, 4)

    def forward(self, x):
        return self.b(self.a(x))  # 16 features into a Linear expecting 12: fails in the meta kernel


def build():
    return Mismatched()
'''


def test_a_model_failing_on_fake_tensors_is_one_sentence_without_torch_log_lines(tmp_path):
    (tmp_path / "mismatched_model.py").write_text(FACTORY)
    result = run_cli("plan", "--model", f"{tmp_path / 'mismatched_model.py'}:build", "--batch", "x=float32[4,8]",
                     "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("scalpel: error:"), result.stderr

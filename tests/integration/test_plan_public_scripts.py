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


@pytest.mark.parametrize(
    ("script", "plain_bytes"),
    [
        # pe (1, 64, 32) fp32 made in forward + src_mask (12, 12) made in forward + scale () made in __init__
        ("lightning_transformer.py", (64 * 32 + 12 * 12 + 1) * 4),
        (
            "fabric_lm.py",
            16 * 16 * 4,
        ),  # the causal mask (16, 16) fp32 made in __init__, model set up by Fabric
    ],
)
def test_plan_copies_plain_tensor_attributes_and_prints_no_torch_log(script, plain_bytes, tmp_path):
    stdout, stderr, plan = _plan(script, tmp_path)
    assert "single" in stdout and "recommendation:" in stdout
    # the model has no registered buffer: every buffer byte is a plain tensor attribute, copied shape for shape
    assert plan["measurement"]["buffer_bytes"] == plain_bytes
    assert "fake_tensor.py" not in stderr and "Traceback" not in stderr


def test_plan_runs_lightnings_demo_transformer_as_it_ships(tmp_path):
    """The demo passes a causal mask without an is_causal hint: nn.Transformer's value check of the mask
    cannot run on fake tensors, and plan used to stop on it ('op aten._local_scalar_dense needs real data')."""
    stdout, stderr, plan = _plan("lightning_demo_unmodified.py", tmp_path)
    assert "recommendation:" in stdout and "Traceback" not in stderr and "fake_tensor.py" not in stderr
    # the lazily made positional table (demo default max_len 5000 x ninp 32, fp32) and the 16x16 mask are planned
    assert plan["measurement"]["buffer_bytes"] >= (16 * 16) * 4


FACTORY = """
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
"""


def test_a_model_failing_on_fake_tensors_is_one_sentence_without_torch_log_lines(tmp_path):
    (tmp_path / "mismatched_model.py").write_text(FACTORY)
    result = run_cli(
        "plan",
        "--model",
        f"{tmp_path / 'mismatched_model.py'}:build",
        "--batch",
        "x=float32[4,8]",
        "--out",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("scalpel: error:"), result.stderr


LBFGS_SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "memory" / "public" / "lbfgs_lstmcell.py"


def _lbfgs_state_bytes_at_the_end() -> int:
    """Witness: the script run to its end (15 steps fill LBFGS's history of 100 pairs); its optimizer's tensors."""
    import contextlib
    import io
    import runpy
    import sys

    import torch

    argv = sys.argv
    sys.argv = [str(LBFGS_SCRIPT)]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            optimizer = runpy.run_path(str(LBFGS_SCRIPT), run_name="__main__")["optimizer"]
    finally:
        sys.argv = argv
    state = next(iter(optimizer.state.values()))
    assert len(state["old_dirs"]) == optimizer.param_groups[0]["history_size"]  # the history is full

    def nbytes(v) -> int:
        if isinstance(v, torch.Tensor):
            return v.numel() * v.element_size() if v.dim() else 0
        return sum(nbytes(x) for x in v) if isinstance(v, list | tuple) else 0

    return sum(nbytes(v) for v in state.values())


def test_lbfgs_closure_evaluations_are_not_micro_batches_and_float64_is_read(tmp_path):
    # time_sequence_prediction: LBFGS evaluates its closure up to 20 times per step on the same batch, in float64
    from torchscalpel.plan.devices import Device
    from torchscalpel.plan.options import PlanOptions
    from torchscalpel.plan.script import plan_script
    from torchscalpel.runtime.target import Target

    result, record = plan_script(
        PlanOptions(target=Target(script=LBFGS_SCRIPT), search_max_batch=False),
        Device(name="cpu", memory=1 << 34, kind="cpu"),
        ["single"],
    )
    settings = result.request.settings
    assert record.steps and record.steps[0].closure_evals > 1  # the runtime saw a closure, not micro-batches
    assert settings.grad_accum == 1, settings.grad_accum
    assert str(settings.precision) == "fp64", settings.precision
    planned, real = result.measurement.optim_bytes, _lbfgs_state_bytes_at_the_end()
    assert abs(planned - real) <= 0.02 * real, (
        planned,
        real,
    )  # history + direction + previous gradient (+1 flat)

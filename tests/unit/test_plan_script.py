"""Script mode: the observer takes model, batch, targets, precision, accumulation and optimizer from step 1."""

from __future__ import annotations

import argparse

import torch

from torchscalpel.plan.devices import Device
from torchscalpel.plan.script import plan_script

SCRIPT = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 5))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = TensorDataset(torch.randn(64, 16), torch.randint(0, 5, (64,)))
STEPS = 0
for epoch in range(3):
    for i, (x, y) in enumerate(DataLoader(data, batch_size=8)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y) / 2
        loss.backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
            STEPS += 1
print("trained", STEPS)
'''


def _plan(tmp_path, name: str, text: str):
    """Script-mode plan of ``text`` saved as ``name``, single rank on a 16 GiB CPU: (plan, record)."""
    script = tmp_path / name
    script.write_text(text)
    args = argparse.Namespace(module=None, target=["--", str(script)], out=tmp_path / "run", optimizer="adamw",
                              precision="fp32", grad_accum=1, world_size=1, nodes=1, activation_checkpointing="none",
                              no_max_batch=True)
    result, record, _out_dir = plan_script(args, Device(name="cpu", memory=1 << 34, kind="cpu"), ["single"])
    return result, record


def test_script_mode_plans_what_the_first_step_used(tmp_path, capsys):
    result, record = _plan(tmp_path, "train_tiny.py", SCRIPT)
    assert record.status == "stopped"  # stopped after the first optimizer step, not run for 3 epochs
    assert "trained" not in capsys.readouterr().out
    request = result.request
    assert request.settings.optimizer.cls == "torch.optim.sgd.SGD"
    assert request.settings.optimizer.kwargs["momentum"] == 0.9
    assert request.settings.precision == "bf16-mixed"
    assert request.settings.grad_accum == 2
    names = [(e.name, e.dtype, e.shape, e.high) for e in request.batch.entries]
    assert names[0] == ("arg0", torch.float32, (8, 16), None)
    assert names[1][:3] == ("target1", torch.int64, (8,)) and 1 <= names[1][3] <= 5
    params = (16 * 64 + 64 + 64 * 5 + 5) * 4
    m = result.measurement
    assert m.param_bytes == params and m.optim_bytes == params  # one momentum buffer per parameter
    assert result.rows[0].breakdown.fits


PROBE_FIRST = '''
import torch
from torch import nn

model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 5))
with torch.no_grad():
    model(torch.randn(2, 16))  # a sanity forward on a small batch, as DDP's unused-parameter probe does
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    x, y = torch.randn(8, 16), torch.randint(0, 5, (8,))
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
'''


def test_script_mode_plans_the_training_forward_not_an_earlier_probe(tmp_path):
    result, _record = _plan(tmp_path, "probe_first.py", PROBE_FIRST)
    assert result.request.batch.entries[0].shape == (8, 16)
    assert result.request.settings.grad_accum == 1

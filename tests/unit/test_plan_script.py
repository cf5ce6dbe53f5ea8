"""Script mode: the observer takes model, batch, targets, precision, accumulation and optimizer from step 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchscalpel.plan.devices import Device
from torchscalpel.plan.options import PlanOptions
from torchscalpel.plan.script import plan_script
from torchscalpel.runtime.target import Target

SCRIPT = """
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
"""


def _plan(tmp_path, name: str, text: str, optimizer: str | None = None):
    """Script-mode plan of ``text`` saved as ``name``, single rank on a 16 GiB CPU: (plan, record)."""
    script = tmp_path / name
    script.write_text(text)
    options = PlanOptions(target=Target(script=script), optimizer=optimizer, search_max_batch=False)
    result, record = plan_script(options, Device(name="cpu", memory=1 << 34, kind="cpu"), ["single"])
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


OPTIMIZER_SCRIPT = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = {}
for _ in range(2):
    nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
    opt.step()
    opt.zero_grad()
"""


PROBE_FIRST = """
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
"""


def test_script_mode_plans_the_training_forward_not_an_earlier_probe(tmp_path):
    result, _record = _plan(tmp_path, "probe_first.py", PROBE_FIRST)
    assert result.request.batch.entries[0].shape == (8, 16)
    assert result.request.settings.grad_accum == 1


SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"


def test_script_mode_replays_keyword_inputs_as_the_model_was_called(tmp_path):
    # model(input_ids=x, labels=x): global forward pre-hooks never see keyword arguments
    result, record = _plan(tmp_path, "hf.py", (SCRIPTS / "plan_hf_kwargs.py").read_text())
    assert record.status == "stopped"
    assert [(e.name, e.shape, e.batch_dim) for e in result.request.batch.entries] == [
        ("input_ids", (2, 16), 0),
        ("labels", (2, 16), 0),
    ]
    assert result.request.settings.optimizer.cls == "torch.optim.adamw.AdamW"
    assert result.request.settings.optimizer.kwargs["weight_decay"] == 0.01
    m = result.measurement  # two moments per parameter (+ Adam's 4-byte step counters)
    assert 0 <= m.optim_bytes - 2 * m.param_bytes < 1024 and m.act_peak_bytes > 0


@pytest.mark.parametrize(
    ("name", "text", "label", "states"),
    [
        ("manual.py", (SCRIPTS / "plan_manual_sgd.py").read_text(), "none", 0),
        ("sgd.py", OPTIMIZER_SCRIPT.format("torch.optim.SGD(model.parameters(), lr=0.1)"), "SGD", 0),
        (
            "adam.py",
            OPTIMIZER_SCRIPT.format("torch.optim.Adam(model.parameters(), betas=(0.8, 0.9))"),
            "Adam",
            2,
        ),
    ],
)
def test_script_mode_prices_the_optimizer_the_script_built_or_none(tmp_path, name, text, label, states):
    result, _record = _plan(tmp_path, name, text)
    assert result.request.settings.optimizer.label == label
    m = result.measurement  # states per parameter (+ Adam's 4-byte step counters)
    assert 0 <= m.optim_bytes - states * m.param_bytes < 64
    assert result.to_dict()["optimizer"] == label


def test_explicit_optimizer_flag_overrides_the_scripts_own(tmp_path):
    result, _record = _plan(
        tmp_path, "manual.py", (SCRIPTS / "plan_manual_sgd.py").read_text(), optimizer="adamw"
    )
    assert result.request.settings.optimizer.label == "AdamW"
    assert 0 <= result.measurement.optim_bytes - 2 * result.measurement.param_bytes < 64


def test_sequence_first_inputs_scale_dimension_1_and_say_so(tmp_path):
    # word_language_model: data (seq=35, batch=20) and an LSTM hidden state (layers, batch, hidden)
    result, _record = _plan(tmp_path, "lstm.py", (SCRIPTS / "plan_seq_first_lstm.py").read_text())
    batch = result.request.batch
    assert [(e.name, e.shape, e.batch_dim) for e in batch.entries] == [
        ("arg0", (35, 20), 1),
        ("arg1_0", (2, 20, 16), 1),
        ("arg1_1", (2, 20, 16), 1),
    ]
    assert batch.batch_size == 20
    assert [e.shape for e in batch.with_batch(64).entries] == [(35, 64), (2, 64, 16), (2, 64, 16)]
    note = result.to_dict()["batch_dims"]
    assert note.startswith("batch dimension dim 1 of arg0, arg1_0, arg1_1") and "batch_first=False" in note


SEQ_FIRST_LOADER = """
import torch
from torch import nn
from torch.utils.data import DataLoader


class BagOfTokens(nn.Module):  # reads (seq, batch) token ids; nothing in it says so
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(30, 8), nn.Linear(8, 3)

    def forward(self, tokens):
        return self.head(self.emb(tokens).mean(0))


data = [(torch.randint(0, 30, (12,)), torch.randint(0, 3, ())) for _ in range(16)]
loader = DataLoader(data, batch_size=4, collate_fn=lambda items: (torch.stack([t for t, _ in items], 1),
                                                                    torch.stack([y for _, y in items])))
model = BagOfTokens()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for tokens, y in loader:
    nn.functional.cross_entropy(model(tokens), y).backward()
    opt.step()
    opt.zero_grad()
"""


def test_the_dataloaders_batch_size_picks_the_batch_dimension(tmp_path):
    result, _record = _plan(tmp_path, "seq_loader.py", SEQ_FIRST_LOADER)
    batch = result.request.batch
    assert [(e.name, e.shape, e.batch_dim) for e in batch.entries] == [
        ("arg0", (12, 4), 1),
        ("target1", (4,), 0),
    ]
    assert batch.batch_size == 4
    assert "the DataLoader's batch_size 4" in result.request.batch_note


def test_a_loader_batch_without_its_loader_still_scales_dimension_0(tmp_path):
    result, _record = _plan(tmp_path, "train_tiny.py", SCRIPT)  # DataLoader(...) built inline, gone by then
    assert result.request.batch.batch_size == 8
    assert (
        result.request.batch_note
        == "batch dimension dim 0 of arg0, target1 (dim 0 of the DataLoader's batch)"
    )


LBFGS_SCRIPT = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
opt = torch.optim.LBFGS(model.parameters(), max_iter=3, history_size=5)
x, y = torch.randn(64, 16), torch.randn(64, 1)
for _ in range(3):
    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss
    opt.step(closure)
"""


def test_a_closure_optimizer_is_planned_with_its_full_history(tmp_path):
    result, record = _plan(tmp_path, "lbfgs.py", LBFGS_SCRIPT)
    assert record.status == "stopped" and result.request.settings.optimizer.label == "LBFGS"
    m = result.measurement  # 2 * history_size direction/step vectors + 3 flat vectors, each all parameters
    assert m.optim_bytes == (2 * 5 + 3) * m.param_bytes

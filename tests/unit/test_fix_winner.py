"""Issue 37, "the patch is exactly what was measured, or nothing": a combined tune winner is planned whole
or refused whole with the part that cannot be placed and the best config fix can place that tune
measured; a part measured slower alone is never offered; autocast holds the forward and loss only; the
snippet fix prints is the whole code, valid Python."""

from __future__ import annotations

import ast
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("libcst")

import torchscalpel.report.fix_terminal as fix_terminal
from torchscalpel.fix.cst import Edit
from torchscalpel.fix.edits import apply_edit
from torchscalpel.fix.locate import tune_plan
from torchscalpel.fix.stage import FixResult, Item
from torchscalpel.record import new_run_record
from torchscalpel.stages.tune import fix_note
from torchscalpel.tune.apply import code_lines
from torchscalpel.tune.settings import TuneSettings

WINNER = TuneSettings(amp="bf16", amp_fp32_attention=True)
SCRIPT = "/p/train.py"


def _site(line: int, cls: str = "", library: str | None = None) -> dict[str, object]:
    return {"file": SCRIPT, "line": line, "class": cls, "library": library, "used": True}


SITES = {
    "optimizers": [_site(20, "AdamW")],
    "model": _site(18, "LlamaForCausalLM"),
    "forward": {**_site(30, "LlamaForCausalLM"), "device": "cpu"},
    "backward": _site(32),
}


def _trial(settings: TuneSettings, verdict: str, baseline_ms: float, ms: float) -> dict[str, object]:
    return {
        "label": settings.label(),
        "settings": settings.to_dict(),
        "status": "ok",
        "verdict": verdict,
        "baseline_ms": baseline_ms,
        "median_ms": ms,
        "confirm_pairs": [[baseline_ms, ms]] if verdict == "winner" else [],
    }


def _record(attention: list[dict[str, object]], trials: list[dict[str, object]] = ()) -> object:
    record = new_run_record("tune", status="complete")
    record.provenance = {"code": {"script": {"path": "train.py", "sha256": "0" * 64}}}
    winner = _trial(WINNER, "winner", 100.0, 75.8)  # 1.32x, one pair
    record.sections["tune"] = {
        "settings": WINNER.to_dict(),
        "winner": winner,
        "trials": [winner, *trials],
        "code_lines": code_lines(WINNER),
        "facts": {"attention_sites": attention},
    }
    record.sections["sites"] = SITES
    return record


BF16_SLOWER = _trial(TuneSettings(amp="bf16"), "not faster", 100.0, 123.5)  # 0.81x alone
HF_ATTENTION = [{"file": SCRIPT, "line": 30, "library": "transformers"}]
OWN_ATTENTION = [{"file": "/p/model.py", "line": 41, "library": None}]
LIB_ATTENTION = [{"file": SCRIPT, "line": 30, "library": "somelib"}]


def test_a_combined_winner_on_a_transformers_model_is_planned_whole() -> None:
    plan = {p.label: p for p in tune_plan(_record(HF_ATTENTION, [BF16_SLOWER]))}
    assert set(plan) == {"autocast bf16", "amp_fp32_attention"}
    amp, attention = plan["autocast bf16"].edit, plan["amp_fp32_attention"].edit
    assert (amp.kind, amp.line, amp.end_line) == ("autocast", 30, 32)
    # after the model's line: transformers' sdpa run in float32 under autocast, registered and switched to
    assert (attention.kind, attention.line, plan["amp_fp32_attention"].file) == (
        "after_statement",
        18,
        Path(SCRIPT),
    )
    assert attention.code.endswith('{var}.set_attn_implementation("sdpa_fp32")\n')
    assert "query.float(), key.float(), value.float()" in attention.code
    assert "with torch.autocast(device_type=device, enabled=False):" in attention.code
    ast.parse(attention.code.replace("{var}", "model"))


def test_a_transformers_model_built_by_from_config_takes_the_attention_at_its_line() -> None:
    record = _record(HF_ATTENTION)
    record.sections["sites"] = {**SITES, "model": _site(18, "LlamaForCausalLM", library="transformers")}
    plan = {p.label: p for p in tune_plan(record)}
    edit = plan["amp_fp32_attention"].edit
    assert (edit.line, edit.callee) == (18, ".from_")  # the line must hold from_config / from_pretrained
    source = "import torch\nmodel = AutoModelForCausalLM.from_config(cfg)\n"
    assert apply_edit(source, replace(edit, line=2))[1].status == "applied"
    _, refused = apply_edit("trainer = Trainer(model_init=make)\n", replace(edit, line=1))
    assert refused.status == "refused" and refused.reason == "line 1 does not hold .from_"


def test_a_combined_winner_with_attention_in_the_users_code_is_planned_whole() -> None:
    plan = {p.label: p for p in tune_plan(_record(OWN_ATTENTION, [BF16_SLOWER]))}
    assert set(plan) == {"autocast bf16", "amp_fp32_attention"}
    attention = plan["amp_fp32_attention"]
    assert (attention.file, attention.edit.kind, attention.edit.line) == (
        Path("/p/model.py"),
        "fp32_attention_call",
        41,
    )


def test_a_winner_with_a_part_fix_cannot_place_is_refused_whole_never_bf16_alone() -> None:
    (item,) = tune_plan(_record(LIB_ATTENTION, [BF16_SLOWER]))
    assert item.edit is None and item.label == "amp=bf16 + amp_fp32_attention"
    assert item.reason == (
        "fix cannot place amp_fp32_attention (the attention runs inside somelib; fix places float32 "
        "attention in your own scaled_dot_product_attention calls and through a transformers model's "
        "attention implementation), and patches no part of the winner alone (a part alone is not what "
        "tune measured at 1.32x); tune measured no other config faster than the baseline that fix can place"
    )
    assert "amp=bf16," not in item.reason  # measured at 0.81x alone: never offered


def test_the_refusal_names_the_best_config_fix_can_place_that_tune_measured() -> None:
    fused = _trial(TuneSettings(optimizer="fused"), "faster", 100.0, 90.0)
    bf16_faster_but_unconfirmed = _trial(TuneSettings(amp="bf16"), "not confirmed", 100.0, 80.0)
    (item,) = tune_plan(_record(LIB_ATTENTION, [BF16_SLOWER, fused, bf16_faster_but_unconfirmed]))
    assert item.reason.endswith(
        "the best config fix can place that tune measured: optimizer=fused, 1.11x faster per step than the "
        "baseline (screened once against the baseline run beside it, spread not measured)"
    )
    assert "amp=bf16," not in item.reason


def test_a_record_without_attention_sites_refuses_rather_than_guessing() -> None:
    (item,) = tune_plan(_record([]))
    assert item.edit is None
    assert (
        "fix cannot place amp_fp32_attention (the record does not say where the model called" in item.reason
    )


def test_tune_says_what_fix_will_not_patch_when_it_writes_its_result() -> None:
    assert fix_note(_record(HF_ATTENTION)) == ""
    assert fix_note(_record(OWN_ATTENTION)) == ""
    note = fix_note(_record(LIB_ATTENTION))
    assert note.startswith("scalpel fix will not patch amp=bf16 + amp_fp32_attention: fix cannot place ")


def test_the_printed_snippet_is_the_whole_code_and_parses() -> None:
    (planned,) = tune_plan(_record(LIB_ATTENTION))
    item = Item(planned.label, "tune", "not patched", reason=planned.reason, snippet=planned.snippet)
    lines = fix_terminal.render(FixResult(patch="", items=[item], root=None))
    start = lines.index(next(line for line in lines if line.startswith("not patched:"))) + 1
    shown = [line for line in lines[start:] if line.startswith("    ")]
    code = textwrap.dedent("\n".join(shown))
    ast.parse(code)  # before: cut after 'with torch.autocast(device_type="cpu", enabled=False):'
    assert code.rstrip().endswith("**attention_kwargs)")
    assert 'with torch.autocast(device_type="cpu", enabled=False):' in code
    assert all(len(line) <= 80 for line in shown)


LOOP = """import torch


def train(model, opt, loader):
    for x, y in loader:
        out = model(x)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
"""

AMP = 'torch.autocast(device_type="cpu", dtype=torch.bfloat16)'


def test_autocast_holds_the_forward_and_loss_never_zero_grad() -> None:
    new, out = apply_edit(LOOP, Edit(kind="autocast", line=6, end_line=9, code=AMP))
    assert out.status == "applied", out.reason
    assert new == LOOP.replace(
        "        out = model(x)\n        opt.zero_grad()\n        loss = ",
        f"        with {AMP}:\n            out = model(x)\n        opt.zero_grad()\n"
        f"        with {AMP}:\n            loss = ",
    )
    again, out = apply_edit(new, Edit(kind="autocast", line=7, end_line=11, code=AMP))
    assert out.status == "already" and again == new
    trailing = LOOP.replace(
        "        opt.zero_grad()\n        loss = torch.nn.functional.cross_entropy(out, y)\n",
        "        loss = torch.nn.functional.cross_entropy(out, y)\n        opt.zero_grad()\n",
    )
    new, out = apply_edit(trailing, Edit(kind="autocast", line=6, end_line=9, code=AMP))
    assert out.status == "applied", out.reason
    assert f"        with {AMP}:\n            out = model(x)\n            loss = " in new
    assert "\n        opt.zero_grad()\n        loss.backward()\n" in new


ATTENTION = """import torch
from torch.nn import functional as F


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, 2, 8).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # the call
        return self.proj(att.transpose(1, 2).reshape(b, t, c))
"""


def _attention(source: str, state: dict[str, object] | None = None) -> object:
    namespace: dict[str, object] = {}
    exec(compile(source, "attention.py", "exec"), namespace)  # the test's own source text
    module = namespace["Attention"]()
    if state is not None:
        module.load_state_dict(state)
    return module


def test_fp32_attention_in_the_users_call_computes_what_tunes_knob_measured() -> None:
    import torch

    from torchscalpel.tune.apply import applied

    new, out = apply_edit(ATTENTION, Edit(kind="fp32_attention_call", line=15))
    assert out.status == "applied", out.reason
    assert (
        "        if torch.is_autocast_enabled(q.device.type):  # tune's amp_fp32_attention\n"
        "            with torch.autocast(device_type=q.device.type, enabled=False):\n"
        "                att = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)"
        "  # the call\n"
        "        else:\n"
        "            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # the call\n"
    ) in new
    assert apply_edit(new, Edit(kind="fp32_attention_call", line=19))[1].status == "already"

    torch.manual_seed(0)
    measured, x = _attention(ATTENTION), torch.randn(2, 6, 16)
    patched = _attention(new, measured.state_dict())
    with applied(WINNER):  # tune's knob: root autocast + the patched F.scaled_dot_product_attention
        y_knob = measured(x)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):  # what fix's autocast edit writes
        y_fix = patched(x)
    assert torch.equal(y_knob, y_fix.float())
    y_knob.pow(2).mean().backward()
    y_fix.float().pow(2).mean().backward()
    assert all(
        torch.equal(a.grad, b.grad) for a, b in zip(measured.parameters(), patched.parameters(), strict=True)
    )
    # without autocast (an evaluation, say) the patched call is the original one
    assert torch.equal(_attention(ATTENTION, measured.state_dict())(x), patched(x))


def test_fp32_attention_refuses_a_call_it_cannot_read() -> None:
    starred = ATTENTION.replace("(q, k, v, is_causal=True)", "(*qkv, is_causal=True)")
    _, out = apply_edit(starred, Edit(kind="fp32_attention_call", line=15))
    assert out.status == "refused"
    assert (
        out.reason
        == "the attention call passes *args or **kwargs, so its query, key and value cannot be read"
    )


MODE_SOURCE = (
    "import torch\n"
    "from transformers import LlamaConfig, LlamaForCausalLM\n"
    "\n"
    "\n"
    "def main():\n"
    "    config = LlamaConfig(hidden_size=64)\n"
    "    net = LlamaForCausalLM(config)\n"
    "    net.train()\n"
)


def _compile_record(spec: dict[str, object]) -> object:
    settings = TuneSettings.from_dict({"compile": spec})
    record = new_run_record("tune", status="complete")
    record.provenance = {"code": {"script": {"path": "train.py", "sha256": "0" * 64}}}
    winner = _trial(settings, "winner", 100.0, 80.0)
    record.sections["tune"] = {
        "settings": settings.to_dict(),
        "winner": winner,
        "trials": [winner],
        "code_lines": code_lines(settings),
    }
    record.sections["sites"] = {**SITES, "model": _site(7, "LlamaForCausalLM")}
    return record


@pytest.mark.parametrize(
    ("spec", "inserted"),
    [
        (
            {"target": "model", "mode": "max-autotune-no-cudagraphs"},
            '    net = LlamaForCausalLM(config)\n    net.compile(mode="max-autotune-no-cudagraphs")\n    net.train()\n',
        ),
        (
            {"target": "LlamaDecoderLayer", "mode": "reduce-overhead", "use_cache": False},
            "    net = LlamaForCausalLM(config)\n"
            "    for _module in net.modules():  # compile each LlamaDecoderLayer block\n"
            '        if type(_module).__name__ == "LlamaDecoderLayer":\n'
            '            _module.compile(mode="reduce-overhead")\n'
            "    net.config.use_cache = False  # no key/value cache in training (what tune measured)\n"
            "    net.train()\n",
        ),
    ],
)
def test_a_compile_mode_the_profile_chose_is_patched_with_its_mode_once(
    spec: dict[str, object], inserted: str
) -> None:
    (planned,) = tune_plan(_compile_record(spec))
    assert planned.edit is not None and planned.edit.kind == "after_statement"
    assert f'mode="{spec["mode"]}"' in planned.snippet
    patched, outcome = apply_edit(MODE_SOURCE, planned.edit)
    assert outcome.status == "applied", outcome.reason
    assert inserted in patched
    ast.parse(patched)
    assert apply_edit(patched, planned.edit)[1].status == "already"  # a second fix adds nothing

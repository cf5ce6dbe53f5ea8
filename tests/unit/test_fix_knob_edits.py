"""scalpel fix's edits for fp16 with a GradScaler, channels_last and activation checkpointing, on source
text in real script styles, and their plans from a record: each lands at the recorded lines, is
idempotent, and refuses a line that does not hold what the run saw there."""

from __future__ import annotations

import pytest

pytest.importorskip("libcst")

from torchscalpel.fix.cst import Edit
from torchscalpel.fix.edits import apply_edit
from torchscalpel.fix.linemap import line_map, remap
from torchscalpel.fix.locate import tune_plan
from torchscalpel.fix.planned import framework_of
from torchscalpel.record import new_run_record
from torchscalpel.sections import SitesSection

LOOP = '''"""A plain loop with clipping."""
import torch
from torch import nn


def main():
    model = nn.Linear(8, 2)  # the model
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-3,
    )
    for x, y in loader:
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)

        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        # the update
        optimizer.step()
        optimizer.zero_grad()
'''

AMP = 'torch.autocast(device_type="cuda", dtype=torch.float16)'


def _fp16(opt: int = 8, fwd: int = 12, bwd: int = 15, step: int = 18) -> Edit:
    return Edit(
        kind="grad_scaler",
        line=opt,
        anchors=(("forward", fwd), ("backward", bwd), ("step", step)),
        code=AMP,
        kwargs=(("device", "cuda"),),
    )


def test_fp16_grad_scaler_at_the_four_recorded_lines_and_idempotent() -> None:
    new, out = apply_edit(LOOP, _fp16())
    assert out.status == "applied", out.reason
    assert new == LOOP.replace(
        "    )\n    for x, y in loader:\n        out = model(x)\n        loss = nn.functional.cross_entropy(out, y)\n",
        '    )\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in loader:\n'
        f"        with {AMP}:\n"
        "            out = model(x)\n            loss = nn.functional.cross_entropy(out, y)\n",
    ).replace(
        "        loss.backward()\n        torch.nn",
        "        scaler.scale(loss).backward()\n        scaler.unscale_(optimizer)\n        torch.nn",
    ).replace("        optimizer.step()\n", "        scaler.step(optimizer)\n        scaler.update()\n")
    assert "# the update\n        scaler.step(optimizer)" in new  # the comment stays above the step
    # Run again on its own result, its lines carried over as scalpel fix carries them (fix.json's map):
    # every part is found done at its line.
    moved = remap(_fp16(), line_map(LOOP, new))
    assert (moved.line, moved.anchors) == (8, (("forward", 14), ("backward", 17), ("step", 21)))
    assert apply_edit(new, moved) == (new, apply_edit(new, moved)[1])
    assert apply_edit(new, moved)[1].status == "already"


def test_fp16_refuses_wrong_lines_and_steps_it_cannot_rewrite() -> None:
    wrong, out = apply_edit(LOOP, _fp16(step=16))  # line 16 is the clipping call, not the step
    assert out.status == "refused" and wrong == LOOP
    assert out.reason == "the line is not a plain OPTIMIZER.step() call"
    _, out = apply_edit(LOOP, _fp16(bwd=13))  # the loss line, not the backward
    assert out.reason == "the backward line is not a plain LOSS.backward() call"
    closure = LOOP.replace("optimizer.step()", "optimizer.step(closure)")
    assert "passes arguments" in apply_edit(closure, _fp16())[1].reason
    other = LOOP.replace("        optimizer.step()", "        other_opt.step()")
    assert "steps other_opt, not optimizer" in apply_edit(other, _fp16())[1].reason
    own = LOOP.replace("    for x, y", '    gs = torch.amp.GradScaler("cuda")\n    for x, y')
    assert "already builds a GradScaler" in apply_edit(own, _fp16(fwd=13, bwd=16, step=19))[1].reason
    order = apply_edit(LOOP, _fp16(opt=12, fwd=8))[1]
    assert order.status == "refused" and "not in that order" in order.reason


def test_fp16_keeps_the_scripts_own_autocast() -> None:
    own = LOOP.replace(
        "        out = model(x)\n        loss",
        f"        with {AMP}:\n            out = model(x)\n        loss",
    )
    new, out = apply_edit(own, _fp16(fwd=13, bwd=16, step=19))
    assert out.status == "applied" and new.count("torch.autocast(") == 1
    assert apply_edit(new, remap(_fp16(fwd=13, bwd=16, step=19), line_map(own, new)))[1].status == "already"
    assert "scaler.scale(loss).backward()" in new and "scaler.update()" in new


CNN = """import torch
model = Net().to(device)
for images, labels in loader:
    loss = criterion(model(images, extra), labels)
    loss.backward()
"""


def test_channels_last_model_and_its_4d_inputs_in_place() -> None:
    to_cl = Edit(
        kind="after_statement",
        line=2,
        code="{var} = {var}.to(memory_format=torch.channels_last)\n",
        marker="{var}.to(memory_format=torch.channels_last)",
    )
    inputs = Edit(
        kind="channels_last_inputs", line=4, kwargs=(("inputs", (0,)), ("arity", 2)), anchors=(("model", 2),)
    )
    two = apply_edit(CNN, Edit(kind="channels_last_inputs", line=4, kwargs=inputs.kwargs))[1]
    assert "holds 2 call(s) with the model's 2 positional" in two.reason  # criterion(...) takes 2 too
    a, out_in = apply_edit(CNN, inputs)  # lower line first, as fix orders them
    b, out_model = apply_edit(a, to_cl)
    assert (out_in.status, out_model.status) == ("applied", "applied")
    assert b == (
        "import torch\nmodel = Net().to(device)\nmodel = model.to(memory_format=torch.channels_last)\n"
        "for images, labels in loader:\n"
        "    loss = criterion(model(images.contiguous(memory_format=torch.channels_last), extra), labels)\n"
        "    loss.backward()\n"
    )
    assert apply_edit(a, inputs)[1].status == "already" and apply_edit(b, to_cl)[1].status == "already"
    wrong = apply_edit(
        CNN, Edit(kind="channels_last_inputs", line=5, kwargs=(("inputs", (0,)), ("arity", 2)))
    )
    assert wrong[1].status == "refused" and "line 5 holds no call(s)" in wrong[1].reason


def _record(
    settings: dict[str, object], sites: dict[str, object], facts: dict[str, object] | None = None
) -> object:
    record = new_run_record("tune", status="complete")
    record.provenance = {"code": {"script": {"path": "train.py", "sha256": "0" * 64}}}
    record.sections["tune"] = {"settings": settings, "facts": facts or {}}
    record.sections["sites"] = sites
    return record


def _site(line: int, cls: str = "", library: str | None = None) -> dict[str, object]:
    return {"file": "/p/train.py", "line": line, "class": cls, "library": library, "used": True}


PLAIN = {
    "optimizers": [_site(8, "AdamW")],
    "model": _site(7, "Net"),
    "forward": {**_site(12, "Net"), "device": "cuda", "input_dims": [4, 2]},
    "backward": _site(15),
    "step": _site(18),
}


def test_fp16_channels_last_and_checkpointing_plans_in_a_plain_loop() -> None:
    record = _record(
        {"amp": "fp16", "channels_last": True, "checkpointing": "blocks"},
        PLAIN,
        {"repeated": [{"cls": "Block", "count": 4, "params": 10}]},
    )
    plan = {p.label: p for p in tune_plan(record)}
    amp = plan["autocast fp16 + GradScaler"].edit
    assert (amp.kind, amp.line, amp.anchors, amp.code) == ("grad_scaler", 8, _fp16().anchors, AMP)
    assert plan["channels_last model"].edit.line == 7
    assert plan["channels_last inputs"].edit.kwargs == (("inputs", (0,)), ("arity", 2))
    assert plan["channels_last inputs"].edit.anchors == (("model", 7),)
    ckpt = plan["checkpointing blocks"].edit
    assert ckpt.kind == "after_statement" and ckpt.line == 7 and '__name__ == "Block"' in ckpt.code
    no_step = _record({"amp": "fp16"}, {k: v for k, v in PLAIN.items() if k != "step"})
    (item,) = tune_plan(no_step)
    assert item.edit is None and item.reason.startswith("the run recorded no training step call; ")


def test_checkpointing_edit_runs_the_blocks_under_checkpoint() -> None:
    import torch

    record = _record(
        {"checkpointing": "blocks"}, {"model": _site(3, "Net")}, {"repeated": [{"cls": "Linear"}]}
    )
    (item,) = tune_plan(record)
    src = "import torch\nfrom torch import nn\nnet = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))\n"
    new, out = apply_edit(src, item.edit)
    assert out.status == "applied" and apply_edit(new, item.edit)[1].status == "already"
    scope: dict[str, object] = {}
    calls: list[object] = []
    real = torch.utils.checkpoint.checkpoint
    torch.utils.checkpoint.checkpoint = lambda *a, **k: calls.append(k) or real(*a, **k)  # type: ignore[assignment]
    try:  # the patched script binds checkpoint when it runs: the counting one, here
        exec(compile(new, "train.py", "exec"), scope)
        scope["net"](torch.randn(2, 4, requires_grad=True)).sum().backward()  # type: ignore[operator]
    finally:
        torch.utils.checkpoint.checkpoint = real
    assert calls == [{"use_reentrant": False}, {"use_reentrant": False}]


def test_framework_precision_switches_hf_lightning_accelerate() -> None:
    hf = {"optimizers": [_site(53, "AdamW", library="transformers")]}
    pl = {"optimizers": [_site(32, "Adam")], "backward": _site(60, library="lightning")}
    acc = {
        "optimizers": [_site(22, "AdamW")],
        "backward": _site(32, library="accelerate"),
        "accelerator": {**_site(15, "Accelerator")},
    }
    assert framework_of(SitesSection.from_dict(acc)) == "accelerate"
    edits = [tune_plan(_record({"amp": "fp16"}, s))[0].edit for s in (hf, pl, acc)]
    assert [(e.kind, e.line, e.callee, e.kwargs) for e in edits] == [
        ("call_anywhere", 0, "TrainingArguments", (("fp16", True),)),
        ("call_anywhere", 0, "Trainer", (("precision", "16-mixed"),)),
        ("call_kwargs", 15, "Accelerator", (("mixed_precision", "fp16"),)),
    ]
    (bf16,) = tune_plan(_record({"amp": "bf16"}, acc))
    assert bf16.edit.kwargs == (("mixed_precision", "bf16"),) and bf16.edit.line == 15
    src = "from accelerate import Accelerator\n\naccelerator = Accelerator(cpu=True)\n"
    new, _ = apply_edit(src, Edit(kind="call_kwargs", line=3, callee="Accelerator", kwargs=bf16.edit.kwargs))
    assert new.endswith('Accelerator(cpu=True, mixed_precision="bf16")\n')
    assert (
        apply_edit(src, Edit(kind="call_kwargs", line=1, callee="Accelerator", kwargs=bf16.edit.kwargs))[
            1
        ].status
        == "refused"
    )

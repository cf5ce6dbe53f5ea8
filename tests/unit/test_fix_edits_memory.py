"""scalpel fix's memory edits on source strings in real script styles (fix/editors/memory.py), and the plan
that picks the ladder's first fitting rung fix can place (fix/memory_plan.py): each edit lands on the
recorded line, is idempotent, and refuses code that is not what the record leads to expect."""

from __future__ import annotations

import pytest

pytest.importorskip("libcst")

from torchscalpel.fix.cst import Edit
from torchscalpel.fix.edits import apply_edit
from torchscalpel.fix.memory_plan import first_placed, memory_plan
from torchscalpel.record import new_run_record

GPT = """import math

import torch
from torch import nn


class GPT(nn.Module):
    def __init__(self, n_layer: int = 4) -> None:
        super().__init__()
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(64)

    def forward(self, x):
        for block in self.h:
            x = block(x)  # one transformer layer
        return self.ln_f(x)


model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
for it in range(10):
    logits = model(torch.randn(8, 16, 64))
    loss = logits.pow(2).mean()
    loss.backward()
    optimizer.step()
    print(it, loss.item())
"""


def _twice(source: str, edit: Edit) -> str:
    """The edit made, then made again on its result: the second time must be ``already``, no change."""
    new, outcome = apply_edit(source, edit)
    assert outcome.status == "applied", outcome.reason
    again, second = apply_edit(new, edit)
    assert second.status == "already" and again == new, second.reason
    return new


def test_checkpoint_wraps_the_block_call_at_the_recorded_line_only() -> None:
    new = _twice(GPT, Edit(kind="checkpoint_call", line=15, callee="Block"))
    lines = new.splitlines()
    assert lines[14] == (
        "            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)  # one transformer layer"
    )
    assert [a for a in lines if a not in GPT.splitlines()] == [lines[14]]  # nothing else moved or changed


def test_checkpoint_keeps_extra_and_keyword_arguments() -> None:
    src = GPT.replace("x = block(x)", "x = self.h[i](x, mask=None)")
    new = _twice(src, Edit(kind="checkpoint_call", line=15, callee="Block"))
    assert "x = torch.utils.checkpoint.checkpoint(self.h[i], x, mask=None, use_reentrant=False)" in new


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("x = x + block(self.ln_f(x))", "line 15 holds 2 calls"),  # which call is the block: not a guess
        ("x = x", "line 15 holds no call"),  # the code moved since the run
        ("x = block(x, use_reentrant=True)", "already passes use_reentrant"),
    ],
)
def test_checkpoint_refuses_a_line_that_is_not_one_block_call(change: str, reason: str) -> None:
    new, outcome = apply_edit(
        GPT.replace("x = block(x)", change), Edit(kind="checkpoint_call", line=15, callee="Block")
    )
    assert (
        outcome.status == "refused"
        and reason in outcome.reason
        and new == GPT.replace("x = block(x)", change)
    )


def test_checkpoint_refuses_a_file_without_import_torch() -> None:
    src = GPT.replace("import torch\n", "from torch import optim\n")
    _, outcome = apply_edit(src, Edit(kind="checkpoint_call", line=15, callee="Block"))
    assert outcome.status == "refused" and "import torch" in outcome.reason


def test_set_to_none_goes_right_after_the_recorded_step() -> None:
    new = _twice(GPT, Edit(kind="zero_grad_after_step", line=25))
    assert "    optimizer.step()\n    optimizer.zero_grad(set_to_none=True)\n    print(it" in new


def test_set_to_none_sets_the_flag_on_the_zero_grad_already_there() -> None:
    src = GPT.replace("optimizer.step()\n", "optimizer.step()\n    optimizer.zero_grad(set_to_none=False)\n")
    new = _twice(src, Edit(kind="zero_grad_after_step", line=25))
    assert "optimizer.zero_grad(set_to_none=True)\n    print" in new and "False" not in new


def test_set_to_none_refuses_a_scaler_step() -> None:
    src = GPT.replace("optimizer.step()", "scaler.step(optimizer)")
    _, outcome = apply_edit(src, Edit(kind="zero_grad_after_step", line=25))
    assert outcome.status == "refused" and "not a plain OPTIMIZER.step() call" in outcome.reason


HF = """from transformers import Trainer, TrainingArguments

args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=32,
    gradient_accumulation_steps=2,
    report_to=[],
)
trainer = Trainer(model=model, args=args, train_dataset=ds)
trainer.train()
"""


def test_hf_micro_batches_keep_the_global_batch() -> None:
    edit = Edit(kind="batch_accum", callee="TrainingArguments", kwargs=(("batch", 32), ("k", 4)))
    new = _twice(HF, edit)
    assert "    per_device_train_batch_size=8,\n    gradient_accumulation_steps=8,\n" in new


def test_hf_micro_batches_refuse_a_batch_that_is_not_the_measured_one() -> None:
    edit = Edit(kind="batch_accum", callee="TrainingArguments", kwargs=(("batch", 32), ("k", 4)))
    _, outcome = apply_edit(HF.replace("=32", "=BATCH"), edit)
    assert outcome.status == "refused" and "not a number written" in outcome.reason
    _, outcome = apply_edit(HF.replace("=32", "=16"), edit)
    assert outcome.status == "refused" and "is 16 in the code, not the batch of 32" in outcome.reason


LIGHTNING = """import lightning as L
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=64, shuffle=True)
trainer = L.Trainer(max_epochs=1, enable_checkpointing=False)
trainer.fit(model, loader)
"""


def test_lightning_micro_batches_split_the_loader_and_accumulate_in_the_trainer() -> None:
    new = _twice(
        LIGHTNING, Edit(kind="batch_accum", line=4, callee="DataLoader", kwargs=(("batch", 64), ("k", 2)))
    )
    assert "DataLoader(ds, batch_size=32, shuffle=True)" in new
    assert "L.Trainer(max_epochs=1, enable_checkpointing=False, accumulate_grad_batches=2)" in new


def _memory_record(ladder: list[dict[str, object]], sites: dict[str, object]) -> object:
    record = new_run_record("memory", status="failed")
    record.provenance = {"code": {"script": {"path": "train.py", "sha256": "0" * 64}}}
    record.sections["memory"] = {
        "top_cause": {"key": "activations"},
        "oom": {"limit": 40 << 20, "live": 41 << 20, "plan": {"batch": 32}, "ladder": ladder},
    }
    record.sections["sites"] = {"optimizers": [], "dataloaders": [], **sites}
    return record


def _rung(kind: str, fits: bool | None, **config: object) -> dict[str, object]:
    return {"kind": kind, "action": kind, "fits": fits, "config": config, "peak": 20 << 20}


SITES = {
    "block": {"file": "/p/train.py", "line": 15, "class": "Block", "library": None},
    "step": {"file": "/p/train.py", "line": 25, "class": "AdamW", "library": None},
    "forward": {"file": "/p/train.py", "line": 22, "library": None, "device": "cpu"},
    "backward": {"file": "/p/train.py", "line": 24, "library": None},
}


def test_the_plan_takes_the_first_fitting_rung_the_file_takes() -> None:
    ladder = [
        _rung("micro-batches", True, microbatches=4),
        _rung("checkpoint-blocks", True),
        _rung("set-to-none", True),
        _rung("bf16", True),
    ]
    alternatives = memory_plan(_memory_record(ladder, SITES))
    assert [p.rule for p in alternatives] == ["micro-batches", "checkpoint-blocks", "set-to-none", "bf16"]
    # a plain loop's split is not rewritten: not patched with the loop as a snippet; then checkpointing, and stop
    planned = first_placed(alternatives, lambda f: GPT)
    assert [(p.rule, p.edit is not None) for p in planned] == [
        ("micro-batches", False),
        ("checkpoint-blocks", True),
    ]
    assert "fix does not rewrite loops" in planned[0].reason and "% 4 == 0" in planned[0].snippet
    assert planned[1].edit == Edit(kind="checkpoint_call", line=15, callee="Block")
    # the block line holds two calls in this file: refused there with the editor's reason, the next rung placed
    planned = first_placed(alternatives, lambda f: GPT.replace("x = block(x)", "x = x + block(self.ln_f(x))"))
    assert [(p.rule, p.edit is not None) for p in planned] == [
        ("micro-batches", False),
        ("checkpoint-blocks", False),
        ("set-to-none", True),
    ]
    assert planned[1].reason.startswith("train.py:15: line 15 holds 2 calls")


def test_the_plan_skips_rungs_that_do_not_fit_and_says_when_none_does() -> None:
    planned = memory_plan(_memory_record([_rung("checkpoint-blocks", False), _rung("bf16", True)], SITES))
    assert [p.rule for p in planned] == ["bf16"] and planned[0].edit is not None
    assert planned[0].edit.kind == "autocast" and (planned[0].edit.line, planned[0].edit.end_line) == (22, 24)
    none = memory_plan(_memory_record([_rung("checkpoint-blocks", False)], SITES))
    assert none[0].edit is None and "no rung of the ladder fits" in none[0].reason


def test_the_plan_uses_the_framework_s_own_switches() -> None:
    hf = {**SITES, "forward": {**SITES["forward"], "library": "transformers"}}
    planned = memory_plan(_memory_record([_rung("checkpoint-blocks", True)], hf))
    assert planned[0].edit is not None and planned[0].edit.kwargs == (("gradient_checkpointing", True),)
    library_blocks = {**SITES, "block": {**SITES["block"], "library": "torch"}}
    planned = memory_plan(_memory_record([_rung("checkpoint-blocks", True)], library_blocks))
    assert planned[0].edit is None and "called by torch code" in planned[0].reason


def test_a_memory_run_that_fit_plans_nothing() -> None:
    record = new_run_record("memory", status="complete")
    record.sections["memory"] = {"peak": {"total": 1}}
    assert memory_plan(record) == []


def test_the_patch_shortcut_without_libcst_says_how_to_install_it(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from torchscalpel.fix.shortcut import write_run_patch

    monkeypatch.setitem(sys.modules, "libcst", None)  # import libcst raises ImportError
    lines = write_run_patch(tmp_path)  # type: ignore[arg-type]
    assert lines == [
        "scalpel: --patch edits your code with libcst, which is not installed; run: pip install 'torchscalpel[fix]'."
    ]

"""scalpel fix's libcst edits on source strings in real script styles: each edit lands on the recorded
line (and only there), keeps comments and layout, is idempotent, and refuses what it cannot place."""

from __future__ import annotations

import pytest

pytest.importorskip("libcst")

from torchscalpel.fix.cst import Edit
from torchscalpel.fix.edits import apply_edit

LOOP = '''"""A plain loop."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=16)
    model = nn.Linear(8, 2)  # the model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
'''

NANOGPT = """import torch
optimizer = torch.optim.AdamW(
    [{"params": decay}, {"params": no_decay}],  # two groups
    lr=learning_rate, betas=(0.9, 0.95),
)
"""

HF = """from transformers import Trainer, TrainingArguments

args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=8,  # small
    report_to=[],
)
Trainer(model=model, args=args, train_dataset=ds).train()
"""


def _changed_lines(before: str, after: str) -> list[str]:
    import difflib

    return [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def test_fused_lands_on_the_optimizer_line_and_drops_foreach() -> None:
    edit = Edit(kind="call_kwargs", line=10, callee="AdamW", kwargs=(("fused", True),), drop=("foreach",))
    new, out = apply_edit(LOOP, edit)
    assert out.status == "applied"
    assert _changed_lines(LOOP, new) == [
        "-    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)",
        "+    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)",
    ]
    assert (
        apply_edit(new, edit) == (new, apply_edit(new, edit)[1])
        and apply_edit(new, edit)[1].status == "already"
    )


def test_an_edit_anchored_on_the_wrong_line_refuses_instead_of_searching() -> None:
    new, out = apply_edit(LOOP, Edit(kind="call_kwargs", line=9, callee="AdamW", kwargs=(("fused", True),)))
    assert out.status == "refused" and new == LOOP
    assert "line 9 holds no call of AdamW" in out.reason


def test_a_multi_line_call_keeps_its_trailing_comma_layout_and_comment() -> None:
    new, out = apply_edit(
        NANOGPT, Edit(kind="call_kwargs", line=2, callee="AdamW", kwargs=(("fused", True),))
    )
    assert out.status == "applied"
    assert "    lr=learning_rate, betas=(0.9, 0.95),\n    fused=True,\n)\n" in new
    assert "# two groups" in new


def test_dataloader_kwargs_and_autocast_around_forward_and_loss() -> None:
    new, _ = apply_edit(
        LOOP,
        Edit(
            kind="call_kwargs", line=8, callee="DataLoader", kwargs=(("num_workers", 2), ("pin_memory", True))
        ),
    )
    assert "batch_size=16, num_workers=2, pin_memory=True)" in new
    code = 'torch.autocast(device_type="cpu", dtype=torch.bfloat16)'
    amp = Edit(kind="autocast", line=12, end_line=13, code=code)
    wrapped, out = apply_edit(new, amp)
    assert out.status == "applied"
    assert _changed_lines(new, wrapped) == [
        "-        loss = nn.functional.cross_entropy(model(x), y)",
        f"+        with {code}:",
        "+            loss = nn.functional.cross_entropy(model(x), y)",
    ]
    assert apply_edit(wrapped, amp)[1].status == "already"


def test_autocast_refuses_a_forward_and_backward_in_one_statement() -> None:
    src = "import torch\nfor x, y in loader:\n    loss_fn(model(x), y).backward()\n"
    new, out = apply_edit(src, Edit(kind="autocast", line=3, end_line=3, code="torch.autocast('cpu')"))
    assert out.status == "refused" and "one statement" in out.reason and new == src


def test_compile_after_the_model_line_uses_the_assigned_name() -> None:
    edit = Edit(kind="after_statement", line=9, code="{var}.compile()\n", marker="{var}.compile(")
    new, out = apply_edit(LOOP, edit)
    assert out.status == "applied"
    assert "    model = nn.Linear(8, 2)  # the model\n    model.compile()\n" in new
    assert apply_edit(new, edit)[1].status == "already"
    _, wrong = apply_edit(LOOP, Edit(kind="after_statement", line=11, code="{var}.compile()\n"))
    assert wrong.status == "refused"  # line 11 opens the loop: not a model being built


def test_global_setting_after_the_imports_once() -> None:
    edit = Edit(kind="global_call", code='torch.set_float32_matmul_precision("high")\n')
    new, _ = apply_edit(LOOP, edit)
    assert (
        'from torch.utils.data import DataLoader, TensorDataset\ntorch.set_float32_matmul_precision("high")\n'
        in new
    )
    assert apply_edit(new, edit)[1].status == "already"
    other = new.replace('"high"', '"medium"')
    assert "another value" in apply_edit(other, edit)[1].reason


def test_doctor_edits_weights_only_state_dict_and_zero_grad() -> None:
    src = (
        "import torch\nstate = torch.load(path, weights_only=False)\ntorch.save(model, 'm.pt')\n"
        "for x in xs:\n    model(x).sum().backward()\n    opt.step()\n"
    )
    a, _ = apply_edit(src, Edit(kind="call_kwargs", line=2, callee="load", kwargs=(("weights_only", True),)))
    b, _ = apply_edit(a, Edit(kind="save_state_dict", line=3, callee="save"))
    zero = Edit(
        kind="after_statement",
        line=6,
        callee=".step(",
        code="{opt}.zero_grad(set_to_none=True)\n",
        marker=".zero_grad(",
    )
    c, out = apply_edit(b, zero)
    assert out.status == "applied"
    assert c == (
        "import torch\nstate = torch.load(path, weights_only=True)\ntorch.save(model.state_dict(), 'm.pt')\n"
        "for x in xs:\n    model(x).sum().backward()\n    opt.step()\n    opt.zero_grad(set_to_none=True)\n"
    )
    assert apply_edit(c, zero)[1].status == "already"


def test_hf_training_arguments_edit_keeps_the_layout() -> None:
    edit = Edit(
        kind="call_anywhere",
        callee="TrainingArguments",
        kwargs=(("bf16", True), ("optim", "adamw_torch_fused")),
    )
    new, out = apply_edit(HF, edit)
    assert out.status == "applied"
    assert '    report_to=[],\n    bf16=True,\n    optim="adamw_torch_fused",\n)' in new
    assert "# small" in new
    assert apply_edit(new, edit)[1].status == "already"
    two = HF + "more = TrainingArguments(output_dir='x')\n"
    assert "2 calls" in apply_edit(two, edit)[1].reason

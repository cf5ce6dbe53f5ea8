"""manual-parameter-update says of the script only what its code shows: the parameters it updates (by its own
names), the lr, the clipping and the lr changes it already has (issue 37: it told a script that clips and
anneals it had "no clipping or LR schedule", and named `model` where the script's model is `fc`)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from torchscalpel.doctor.api import diagnose
from torchscalpel.doctor.rules.manual_update import describe, manual_updates
from torchscalpel.doctor.static import StaticContext
from torchscalpel.doctor.static_scan import analyze_source
from torchscalpel.runtime.target import Target

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "doctor" / "manual_parameter_update_clip_anneal.py"
)


def _finding(source: str):
    (f,) = [f for f in analyze_source(textwrap.dedent(source), "t.py") if f.rule == "manual-parameter-update"]
    return f


def _check_fix(fix: str) -> None:
    ast.parse(fix)  # printed code parses
    assert "model" not in fix


def test_a_script_that_clips_and_anneals_is_told_so_and_its_model_is_named() -> None:
    f = _finding(FIXTURE.read_text())
    assert "no momentum" not in f.message and "clipping or LR schedule" not in f.message
    assert "at line 28 (`param.data.add_(-lr * param.grad)`)" in f.message
    assert "The script clips its gradients (clip_grad_norm_, line 26)" in f.message
    assert "The script changes its lr itself (line 30: `lr /= 2.0`)" in f.message
    assert (
        f.fix.splitlines()[0]
        == "optimizer = torch.optim.SGD(fc.parameters(), lr=lr)  # once, before the loop"
    )
    assert "# clip_grad_norm_ (line 26) stays where it is, before optimizer.step()" in f.fix
    assert 'for group in optimizer.param_groups:\n    group["lr"] = lr' in f.fix
    _check_fix(f.fix)


def test_a_plain_update_claims_nothing_it_did_not_read() -> None:
    f = _finding(
        """
        import torch
        net = torch.nn.Linear(2, 1)
        for x in range(3):
            net(torch.ones(1, 2)).sum().backward()
            for name, p in net.named_parameters():
                p.data.add_(p.grad, alpha=-0.05)
        """
    )
    assert "clips" not in f.message and "changes its lr" not in f.message
    assert "torch.optim.SGD(net.parameters(), lr=0.05)" in f.fix and "param_groups" not in f.fix
    _check_fix(f.fix)


@pytest.mark.parametrize(
    ("code", "params", "lr", "changes"),
    [
        # no loop over parameters: the names the file updates
        ("w.data = w.data - lr * w.grad\nb.data = b.data - lr * b.grad\n", "[w, b]", "lr", []),
        # an lr from the arguments, reassigned inside the loop (a schedule)
        (
            "lr = args.lr\nfor it in range(9):\n    lr = args.lr * 0.9 ** it\n"
            "    for p in params:\n        p -= lr * p.grad\n",
            "params",
            "lr",
            [3],
        ),
        ("for q in m.parameters():\n    q.data.sub_(args.lr * q.grad)\n", "m.parameters()", "args.lr", []),
        # an lr computed in the update itself: a schedule, set before each step
        (
            "for p in m.parameters():\n    p.data.add_(p.grad, alpha=-get_lr(it))\n",
            "m.parameters()",
            "get_lr(it)",
            [2],
        ),
    ],
)
def test_what_the_update_reads(code: str, params: str, lr: str, changes: list[int]) -> None:
    ctx = StaticContext.parse(code, "t.py")
    first = min(manual_updates(ctx), key=lambda n: n.lineno)
    update = describe(ctx, first)
    assert ast.unparse(update.params) == params
    assert update.lr is not None and ast.unparse(update.lr) == lr
    assert [line for line, _ in update.lr_changes] == changes


def test_the_runtime_finding_reads_the_file_where_the_backward_ran() -> None:
    """The runtime half replaces the static one in doctor's output: it must say the same of the script."""
    _, findings = diagnose(Target(script=FIXTURE), steps=20, nan_rerun=False, sanity=False)
    (f,) = [f for f in findings if f.rule == "manual-parameter-update"]
    assert f.source == "runtime" and f.location is not None and f.location.line == 28
    assert "they changed between backward calls and no optimizer exists" in f.message
    assert "clipping or LR schedule" not in f.message
    assert "The script clips its gradients (clip_grad_norm_, line 26)" in f.message
    assert "(line 30: `lr /= 2.0`)" in f.message
    assert "torch.optim.SGD(fc.parameters(), lr=lr)" in f.fix
    _check_fix(f.fix)

"""The parts of `scalpel fix --verify` that decide without running anything: what a run wrote into its
copy and putting the copy back, the pickled checkpoints left out of the copies, a failed start's own
error lines, and the loss comparison through tune's numerics gate (given numbers)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from torchscalpel.fix.stage import FixResult, Item
from torchscalpel.fix.steptimer import LOSS_STEPS
from torchscalpel.fix.verify import Start, Verification, error_lines
from torchscalpel.fix.verify_losses import Expectation, expectation, judge_losses
from torchscalpel.fix.verify_tree import Tree, pickled_checkpoints
from torchscalpel.tune.knobs import EXACT, LOW_PRECISION
from torchscalpel.tune.verify import GATE_STEPS


def test_a_tree_names_what_a_run_wrote_and_is_put_back_as_made(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "train.py").write_text("print('old')\n", encoding="utf-8")
    (src / "data" / "x.txt").write_text("data\n", encoding="utf-8")
    tree = Tree.copy(src, tmp_path / "copy", {"train.py": b"print('patched')\n"})
    assert tree.written() == []
    (tree.path / "ckpt").mkdir()
    (tree.path / "ckpt" / "last.pt").write_bytes(b"x")
    (tree.path / "data" / "x.txt").write_text("changed by the run\n", encoding="utf-8")
    (tree.path / "__pycache__").mkdir()  # caches are not what a script reads back
    (tree.path / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"")
    assert tree.written() == ["ckpt/last.pt", "data/x.txt"]
    tree.reset()
    assert tree.written() == [] and not (tree.path / "ckpt").exists()
    assert (tree.path / "data" / "x.txt").read_text(encoding="utf-8") == "data\n"
    assert (tree.path / "train.py").read_text(encoding="utf-8") == "print('patched')\n"


def test_pickled_modules_are_found_and_state_dicts_are_not(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    model = nn.Linear(2, 1)
    torch.save(model, tmp_path / "ckpt" / "last.pt")
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    torch.save({"step": 3, "t": torch.ones(2)}, tmp_path / "state.pt")
    (tmp_path / "notes.zip").write_bytes(b"PK\x03\x04 not a checkpoint")
    assert pickled_checkpoints(tmp_path) == ["ckpt/last.pt"]


TRACEBACK = """epoch 0 loss 0.91
Traceback (most recent call last):
  File "/tmp/scalpel-fix-verify-x/patched/train.py", line 19, in <module>
    model.train()
    ^^^^^^^^^^^
AttributeError: 'collections.OrderedDict' object has no attribute 'train'
"""

LIBRARY_TRACEBACK = """Traceback (most recent call last):
  File "/tmp/scalpel-fix-verify-x/patched/train.py", line 8, in <module>
    model = torch.load(CKPT, weights_only=True)
  File "/venv/lib/python3.11/site-packages/torch/serialization.py", line 1609, in load
    raise pickle.UnpicklingError(_get_wo_message(str(e))) from None
_pickle.UnpicklingError: Weights only load failed.
\tWeightsUnpickler error: Unsupported global: GLOBAL torch.nn.modules.linear.Linear
"""


def test_a_failed_start_shows_the_scripts_own_line_and_exception() -> None:
    folder = Path("/tmp/scalpel-fix-verify-x/patched")
    assert error_lines(TRACEBACK, folder) == [
        'File "train.py", line 19, in <module>',
        "model.train()",
        "AttributeError: 'collections.OrderedDict' object has no attribute 'train'",
    ]
    assert error_lines(LIBRARY_TRACEBACK, folder) == [
        'File "train.py", line 8, in <module>',
        "model = torch.load(CKPT, weights_only=True)",
        "_pickle.UnpicklingError: Weights only load failed.",
        "WeightsUnpickler error: Unsupported global: GLOBAL torch.nn.modules.linear.Linear",
    ]
    assert error_lines("usage: train.py [-h]\ntrain.py: error: bad flag\n", folder)[-1] == (
        "train.py: error: bad flag"
    )


def test_the_second_start_is_reported_with_what_the_first_wrote_and_its_error() -> None:
    v = Verification(
        starts=[
            Start(0, wrote=["ckpt/last.pt"]),
            Start(1, error=['File "train.py", line 19, in <module>', "AttributeError: x"]),
        ]
    )
    assert v.lines() == [
        "plain python: the patched script exited 0",
        "plain python, second start in the same copy (the first wrote ckpt/last.pt): the patched script "
        "exited 1; its last lines:",
        '    File "train.py", line 19, in <module>',
        "    AttributeError: x",
        "NOT verified",
    ]


def test_the_loss_window_is_tunes_gate_window() -> None:
    assert LOSS_STEPS == GATE_STEPS


BASE = [2.0, 1.5, 1.2, 1.0, 0.9, 0.8, 0.7, 0.65, 0.6, 0.55]


def _never() -> list[float | None]:
    raise AssertionError("the original is re-run only when the first comparison fails")


def test_losses_within_tunes_tolerance_pass_and_beyond_it_fail_with_the_numbers() -> None:
    same = judge_losses(Expectation(EXACT), BASE, [b * (1 + 1e-6) for b in BASE], _never)
    assert same.ok and same.line.startswith("losses: patched vs original over the first 10 steps:")
    assert "within tune's numerics tolerance 1.0e-04 (exact)" in same.line
    changed = [b * 1.1 for b in BASE]
    differ = judge_losses(Expectation(EXACT), BASE, changed, lambda: list(BASE))
    assert not differ.ok
    assert differ.line == (
        "losses: patched vs original: loss deviates 1.00e-01 > tolerance 1.0e-04 (exact) over the first 10 steps"
    )


def test_a_script_that_is_not_deterministic_is_held_to_three_times_its_own_deviation() -> None:
    rerun = [b * 1.02 for b in BASE]  # the original itself moves 2 % between two runs
    verdict = judge_losses(Expectation(EXACT), BASE, [b * 1.05 for b in BASE], lambda: rerun)
    assert verdict.ok and "tolerance 6.0e-02 (exact; the script's own run-to-run deviation 2.0e-02)" in (
        verdict.line
    )


def _result(*items: Item) -> FixResult:
    return FixResult(patch="", items=list(items), root=None)


def test_fixes_that_change_the_training_on_purpose_are_not_compared() -> None:
    seeded = _result(Item("unseeded-run", "doctor", "patched", rule="unseeded-run"))
    expect = expectation(seeded)
    assert expect.numerics is None
    verdict = judge_losses(expect, BASE, [1.0] * 10, _never)
    assert verdict.ok and verdict.line == (
        "losses: not compared: unseeded-run changes the training on purpose "
        "(the seed changes the initial weights and the batches)"
    )
    saved = _result(
        Item("whole-model-save", "doctor", "patched", rule="whole-model-save"),
        Item("bf16", "memory", "patched", rule="bf16"),
        Item("unseeded-run", "doctor", "not patched", rule="unseeded-run"),
    )
    assert expectation(saved).numerics == LOW_PRECISION

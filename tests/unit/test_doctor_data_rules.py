"""Data sanity (``input-*``, ``batch-*``, ``label-out-of-range``) and ``train-in-eval-mode``, run in-process
under the doctor on small loops (each with a twin that must stay silent)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import torchscalpel
from torchscalpel.doctor.rules.rt_batch_values import BatchValues
from torchscalpel.findings import Finding


def doctor_of(loop: Callable[[], None]) -> list[Finding]:
    with torchscalpel.doctor(steps=None, static=False, report=False, time_cap_s=None) as run:
        loop()
    return run.findings


def slugs(findings: list[Finding]) -> set[str]:
    return {f.rule for f in findings}


def train_steps(model: nn.Module, batches) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in batches:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()  # looked up at the call, as a script does
        optimizer.step()


def test_unnormalised_columns_fire_and_standardised_ones_do_not() -> None:
    torch.manual_seed(0)
    raw = torch.randn(128, 4) * torch.tensor([1000.0, 1.0, 0.5, 0.2])
    y = torch.randint(0, 3, (128,))
    batches = [(raw[i : i + 32], y[i : i + 32]) for i in range(0, 128, 32)]
    found = doctor_of(lambda: train_steps(nn.Linear(4, 3), batches))
    (f,) = [f for f in found if f.rule == "input-unnormalised"]
    assert "feature 0" in f.evidence[0] and "feature 3" in f.evidence[0]
    assert f.location is not None and f.location.file == __file__
    scaled = [((x - raw.mean(0)) / raw.std(0), t) for x, t in batches]
    assert "input-unnormalised" not in slugs(doctor_of(lambda: train_steps(nn.Linear(4, 3), scaled)))


def test_raw_pixels_are_unnormalised_and_a_repeated_sample_is_a_constant_batch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    pixels = torch.randint(0, 256, (4, 16, 1, 8, 8)).float()
    y = torch.randint(0, 10, (4, 16))
    found = slugs(doctor_of(lambda: train_steps(model, zip(pixels, y, strict=True))))
    assert "input-unnormalised" in found and "batch-constant" not in found
    same = pixels[:, :1].expand(-1, 16, -1, -1, -1) / 255.0
    found = slugs(doctor_of(lambda: train_steps(model, zip(same, y, strict=True))))
    assert "batch-constant" in found and "input-unnormalised" not in found


def test_nan_in_any_input_and_inf_in_the_first_only() -> None:
    rule = BatchValues()
    model = nn.Linear(4, 2)
    x = torch.randn(8, 4)
    mask = torch.zeros(8, 4)
    mask[0, 0] = float("-inf")  # an additive attention mask: -inf is meant
    with torch.enable_grad():
        rule.on_forward_pre(model, (x, mask), {}, True)
    assert not list(rule.findings(None))
    x_nan = x.clone()
    x_nan[3, 1] = float("nan")
    with torch.enable_grad():
        rule.on_forward_pre(model, (x_nan, mask), {}, True)
    (f,) = rule.findings(None)
    assert f.rule == "input-not-finite" and "1 NaN value(s) of 32 in input 0" in f.evidence[0]


def test_labels_beyond_the_output_width_are_reported_before_the_loss_fails() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(32, 6), torch.randint(1, 5, (32,))
    y[0] = 4  # 1-based labels 1..4 for a 4-way head

    def loop() -> None:
        with pytest.raises(IndexError):
            train_steps(nn.Linear(6, 4), [(x, y)])

    (f,) = [f for f in doctor_of(loop) if f.rule == "label-out-of-range"]
    assert "labels 1..4 given to cross_entropy with an input of 4 classes" in f.evidence[0]
    assert "y - 1" in f.fix
    # padding labels (-100, the ignore_index) are no labels
    y_pad = torch.randint(0, 4, (32,))
    y_pad[:5] = -100
    assert "label-out-of-range" not in slugs(
        doctor_of(lambda: train_steps(nn.Linear(6, 4), [(x, y_pad)] * 3))
    )


def test_batches_of_one_class_fire_and_mixed_batches_do_not() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 16, 6)
    one = torch.arange(5).repeat_interleave(16).view(5, 16)  # batch i: class i only
    found = doctor_of(lambda: train_steps(nn.Linear(6, 5), zip(x, one, strict=True)))
    (f,) = [f for f in found if f.rule == "batch-one-class"]
    assert "0, 1, 2" in f.evidence[0]
    rare = torch.zeros(5, 16, dtype=torch.long)  # a binary task whose positives are rare: no finding
    assert "batch-one-class" not in slugs(
        doctor_of(lambda: train_steps(nn.Linear(6, 2), zip(x, rare, strict=True)))
    )
    mixed = torch.randint(0, 5, (5, 16))
    assert "batch-one-class" not in slugs(
        doctor_of(lambda: train_steps(nn.Linear(6, 5), zip(x, mixed, strict=True)))
    )


def _loop_with_evaluation(model: nn.Module, *, restore: bool) -> Callable[[], None]:
    def loop() -> None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
        model.train()
        for step in range(8):
            if restore:
                model.train()
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            if step == 2:
                model.eval()  # the evaluation's line: where model.train() is missing
                with torch.no_grad():
                    model(x)

    return loop


def test_training_after_an_evaluation_in_eval_mode_names_the_eval_call() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    (f,) = [
        f for f in doctor_of(_loop_with_evaluation(model, restore=False)) if f.rule == "train-in-eval-mode"
    ]
    assert "5 training step(s)" in f.evidence[0] and "1 (Dropout)" in f.evidence[0]
    source = Path(__file__).read_text(encoding="utf-8").splitlines()
    assert f.location is not None and "model.eval()" in source[f.location.line - 1]
    assert "train-in-eval-mode" not in slugs(doctor_of(_loop_with_evaluation(model, restore=True)))


def test_a_model_without_dropout_or_batch_norm_is_not_reported() -> None:
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    assert "train-in-eval-mode" not in slugs(doctor_of(_loop_with_evaluation(model, restore=False)))

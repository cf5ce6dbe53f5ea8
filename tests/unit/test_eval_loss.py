"""The loss of each evaluation pass (``sections["eval"]``): what the runtime records, how the record checks it,
what the trackers and the report get, and the verdicts on the curve (:mod:`torchscalpel.doctor.eval_curve`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchscalpel
from torchscalpel.doctor.eval_curve import MIN_PASSES, judge, usable_passes
from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.sections import check_section
from torchscalpel.tracking.scalars import step_scalars


def _train_and_evaluate(
    tmp_path: Path, *, evaluate_every: int, steps: int, reduction: str = "mean"
) -> RunRecord:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    xv, yv = torch.randn(40, 8), torch.randint(0, 3, (40,))
    criterion = nn.CrossEntropyLoss()
    expected: list[float] = []
    with torchscalpel.profile(
        warmup=1, steps=None, out=tmp_path / "run", report=False, profile_steps=0
    ) as run:
        for step in range(steps):
            loss = criterion(model(x[step % 4 * 16 :][:16]), y[step % 4 * 16 :][:16])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                # a no-grad loss with no evaluation forward (logging the training batch) is no pass
                nn.functional.cross_entropy(loss.new_zeros(2, 3), torch.tensor([0, 1]))
            if (step + 1) % evaluate_every == 0:
                model.eval()
                batch_means = []
                with torch.no_grad():
                    for i in range(0, 40, 16):
                        out = nn.functional.cross_entropy(
                            model(xv[i : i + 16]), yv[i : i + 16], reduction=reduction
                        )
                        batch_means.append(float(out) / (len(yv[i : i + 16]) if reduction == "sum" else 1))
                expected.append(sum(batch_means) / len(batch_means))
                model.train()
    run.record.extra["expected"] = expected
    return run.record


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_each_evaluation_pass_is_recorded_with_its_mean_loss_and_step(tmp_path: Path, reduction: str) -> None:
    record = _train_and_evaluate(tmp_path, evaluate_every=3, steps=9, reduction=reduction)
    section = record.sections["eval"]
    assert [p["step"] for p in section["passes"]] == [3, 6, 9]
    assert [p["batches"] for p in section["passes"]] == [3, 3, 3]
    assert [p["loss"] for p in section["passes"]] == pytest.approx(record.extra["expected"], rel=1e-6)
    assert section["functions"] == ["cross_entropy"]
    assert section["site"]["file"] == __file__
    assert check_section("eval", section) is None
    # restored after the run: the script's functions are torch's own again
    assert nn.functional.cross_entropy.__module__ == "torch.nn.functional"
    assert not hasattr(nn.functional.cross_entropy, "__wrapped__")


def test_a_run_without_evaluation_has_no_eval_section(tmp_path: Path) -> None:
    record = _train_and_evaluate(tmp_path, evaluate_every=100, steps=4)
    assert "eval" not in record.sections


def test_the_trackers_get_eval_loss_at_the_step_each_pass_ran_after(tmp_path: Path) -> None:
    record = _train_and_evaluate(tmp_path, evaluate_every=3, steps=9)
    scalars = dict(step_scalars(record))
    losses = [p["loss"] for p in record.sections["eval"]["passes"]]
    assert [scalars[i].get("eval/loss") for i in (3, 6, 9)] == losses
    assert "train/loss" not in scalars[9]  # the pass after the last step adds an index of its own
    assert all("eval/loss" not in scalars[i] for i in (0, 1, 2, 4, 5, 7, 8))


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"passes": [{"step": -1, "loss": 1.0, "batches": 2}]}, "sections.eval.passes[0].step"),
        ({"passes": [{"step": 1, "loss": "x", "batches": 2}]}, "sections.eval.passes[0].loss"),
        ({"passes": [{"step": 1, "loss": 1.0}]}, "sections.eval.passes[0].batches is missing"),
        ({"site": {"file": "t.py", "line": 0}}, "sections.eval.site.line"),
    ],
)
def test_a_malformed_eval_section_is_refused_naming_the_value(section: dict, problem: str) -> None:
    said = check_section("eval", section)
    assert said is not None and said.startswith(problem)


def _curve(values: list[float], every: int = 3) -> list[tuple[int, float]]:
    return [((i + 1) * every, v) for i, v in enumerate(values)]


FALLING_TRAIN = [(i, 2.0 * 0.98**i) for i in range(60)]
FLAT_TRAIN = [(i, 1.0) for i in range(60)]


@pytest.mark.parametrize(
    ("values", "train", "slug"),
    [
        (
            [1.9, 1.4, 1.0, 0.8, 0.74, 0.92, 0.86, 0.98, 1.07, 1.13, 1.18],
            FALLING_TRAIN,
            "val-loss-overfitting",
        ),
        # the same curve while the training loss does not fall is no overfitting (nor noise, nor flat)
        ([1.9, 1.4, 1.0, 0.8, 0.74, 0.92, 0.86, 0.98, 1.07, 1.13, 1.18], FLAT_TRAIN, None),
        (
            [0.59, 0.58, 0.53, 0.87, 0.48, 0.57, 0.63, 0.76, 0.52, 0.53, 0.55, 0.47],
            FALLING_TRAIN,
            "val-loss-oscillating",
        ),
        (
            [2.0, 1.5, 1.2, 1.0, 0.9, 0.846, 0.845, 0.846, 0.844, 0.846, 0.845, 0.846],
            FALLING_TRAIN,
            "val-loss-plateau",
        ),
        ([2.09, 1.79, 1.45, 1.14, 0.90, 0.76, 0.66, 0.59, 0.55, 0.51, 0.49, 0.46], FALLING_TRAIN, None),
        ([1.0, 2.0, 1.0, 2.0], FALLING_TRAIN, None),  # too few passes to judge: nothing said
    ],
)
def test_judge_tells_overfitting_oscillation_and_plateau_apart(values, train, slug) -> None:
    verdict = judge(_curve(values), train)
    assert (verdict.slug if verdict else None) == slug


def test_a_pass_after_every_step_is_no_evaluation_schedule_to_judge() -> None:
    noisy = [0.59, 0.58, 0.53, 0.87, 0.48, 0.57, 0.63, 0.76, 0.52, 0.53, 0.55, 0.47]
    assert judge(_curve(noisy, every=2), FALLING_TRAIN) is not None
    assert judge(_curve(noisy, every=1), FALLING_TRAIN) is None  # a teacher's or a logged no-grad loss


def test_too_few_passes_is_no_verdict_whatever_the_curve() -> None:
    rising = [0.5, 0.6, 0.8, 1.2, 2.0, 3.0][: MIN_PASSES - 1]
    assert judge(_curve(rising), FALLING_TRAIN) is None


def test_a_sanity_check_pass_of_two_batches_is_not_a_point_of_the_curve() -> None:
    passes = [{"step": 0, "loss": 9.0, "batches": 2}] + [
        {"step": 10 * (i + 1), "loss": 1.0 - 0.01 * i, "batches": 12} for i in range(5)
    ]
    assert usable_passes(passes) == [(10 * (i + 1), 1.0 - 0.01 * i) for i in range(5)]
    assert usable_passes([{"step": 1, "loss": None, "batches": 3}]) == []


def test_the_report_draws_the_validation_curve_with_its_verdict() -> None:
    from torchscalpel.report.profile_sections import build

    steps = [StepRecord(index=i, total_ms=1.0, loss=2.0 * 0.95**i) for i in range(40)]
    values = [1.9, 1.4, 1.0, 0.8, 0.74, 0.92, 0.86, 0.98, 1.07, 1.13, 1.18]
    record = RunRecord(name="t", steps=steps)
    record.sections["eval"] = {"passes": [{"step": s, "loss": v, "batches": 4} for s, v in _curve(values)]}
    body = next(s.body for s in build(record) if s.id == "loss-memory")
    assert "validation" in body and "training" in body
    assert "overfitting: the validation loss rose" in body
    record.sections["eval"]["passes"] = record.sections["eval"]["passes"][:3]
    body = next(s.body for s in build(record) if s.id == "loss-memory")
    assert "3 evaluation pass(es): too few to judge the curve" in body

"""The range test suspends the script's LR scheduler: step() keeps its bookkeeping, the groups stay put."""

from __future__ import annotations

import pytest
import torch

from torchscalpel.lrfind.observer import LrSweepObserver
from torchscalpel.lrfind.options import LrOptions


@pytest.mark.parametrize("kind", ["onecycle", "lambda", "plateau", "sequential"])
def test_scheduler_step_moves_nothing_while_suspended(kind: str) -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    observer = LrSweepObserver(LrOptions(min_lr=1e-4, max_lr=1.0, steps=10))
    undo = observer.setup()
    try:
        if kind == "onecycle":  # cycles the momentum too
            sched: object = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=50)
        elif kind == "lambda":  # HF Trainer's
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 10)
        elif kind == "plateau":
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
        else:
            sched = torch.optim.lr_scheduler.SequentialLR(
                opt,
                [
                    torch.optim.lr_scheduler.ConstantLR(opt, 0.5, 2),
                    torch.optim.lr_scheduler.ExponentialLR(opt, 0.5),
                ],
                milestones=[2],
            )
        before = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        for i in range(5):
            opt.step()
            sched.step(float(i)) if kind == "plateau" else sched.step()  # type: ignore[attr-defined]
        after = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        assert after == before
        assert (
            observer.scheduler_steps == 5
        )  # the script's calls, not __init__'s nor SequentialLR's inner ones
        if kind != "plateau":
            assert sched.get_last_lr() == [before[0]["lr"]]  # type: ignore[attr-defined]
    finally:
        undo()
    sched.step(10.0) if kind == "plateau" else sched.step()  # type: ignore[attr-defined]
    sched.step(10.0) if kind == "plateau" else sched.step()  # type: ignore[attr-defined]
    assert opt.param_groups[0]["lr"] != before[0]["lr"]  # undone: the scheduler moves the lr again


def test_a_tensor_lr_is_set_in_place() -> None:
    # capturable / fused optimizers keep lr as a tensor: it is filled, not replaced by a float
    model = torch.nn.Linear(2, 2)
    lr = torch.tensor(0.01)
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    observer = LrSweepObserver(LrOptions(min_lr=1e-4, max_lr=1.0, steps=10))
    observer.on_optimizer_step_pre(opt)
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(1e-4)
    observer.on_optimizer_step_pre(opt)
    assert lr.item() == pytest.approx(1e-4 * (1e4 ** (1 / 9)))

"""``torchscalpel.memory(...)`` around a block of the user's code: the same section, and the limit stops the block."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import torchscalpel


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, keep: list[torch.Tensor]) -> int:
    done = 0
    for _ in range(steps):
        loss = model(torch.randn(64, 128)).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        keep.append(torch.empty(256 * 1024))  # 1 MiB a step, kept: growth
        done += 1
    return done


def test_inprocess_memory_block_and_limit(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 128))
    opt = torch.optim.Adam(model.parameters())
    keep: list[torch.Tensor] = []
    with torchscalpel.memory(steps=6, warmup=1, out=tmp_path / "a", report=False) as run:
        _train(model, opt, 20, keep)
    m = run.record.sections["memory"]
    assert run.record.status == "stopped"
    assert m["peak"]["by_category"]["parameters"] == sum(p.numel() * 4 for p in model.parameters())
    assert m["peak"]["by_category"]["optimizer_state"] >= 2 * m["peak"]["by_category"]["parameters"]
    assert m["growth"]["per_step"] >= 2**20 * 0.9
    assert m["growth"]["sites"][0]["site"].startswith(__file__)
    keep.clear()
    with torchscalpel.memory(steps=None, out=tmp_path / "b", memory_limit="4MiB", report=False) as run:
        _train(model, opt, 50, keep)
    m = run.record.sections["memory"]
    assert run.record.status == "failed" and "memory limit 4.0 MiB exceeded" in run.record.error
    assert m["oom"]["live"] > 4 * 2**20 and (tmp_path / "b" / "memory-live.json").is_file()


def test_a_crash_in_the_analysis_keeps_the_snapshot_and_the_record(tmp_path: Path, monkeypatch) -> None:
    from torchscalpel.memory import analysis

    def broken(*args: object, **kwargs: object) -> dict:
        raise RuntimeError("analysis bug")

    monkeypatch.setattr(analysis, "build_section", broken)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 128))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscalpel.memory(steps=None, out=tmp_path, memory_limit="3MiB", report=False) as run:
        _train(model, opt, 50, [])
    m = run.record.sections["memory"]
    assert (
        "analysis bug" in m["error"] and m["oom"]["live"] > 3 * 2**20
    )  # what was measured, in the record's shape
    assert (tmp_path / "memory-live.json").is_file() and (tmp_path / "run.json").is_file()


def test_a_peak_before_training_is_kept_apart_from_the_training_peak(tmp_path: Path) -> None:
    # a dataset materialised as tensors before training (closure_sgd.py's digits / 16.0) can be the run's peak
    model = nn.Linear(128, 128)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscalpel.memory(steps=2, warmup=0, out=tmp_path, report=False) as run:
        data = torch.empty(4 * 2**20) / 2.0  # 16 MiB twice at once, then 16 MiB kept
        _train(model, opt, 2, [])
        del data
    m = run.record.sections["memory"]
    # the breakdown is the training peak's; the higher one before training is named beside it, with its site
    assert m["peak"]["phase"] != "before training" and m["peak"]["total"] < 32 * 2**20
    assert m["peak"]["by_category"]["parameters"] == 128 * 129 * 4
    before = m["before_training"]
    assert before["total"] >= 32 * 2**20 and before["site"].startswith(__file__)
    import torchscalpel.report.memory_terminal as memory_terminal
    from torchscalpel.sections import MemorySection

    assert any(
        line.startswith("before training the live total was higher")
        for line in memory_terminal.render(MemorySection.from_dict(m))
    )


def test_a_closure_steps_update_is_in_the_optimizer_phase(tmp_path: Path) -> None:
    # optimizer.step(closure) (Lightning's automatic optimization, LBFGS): forward and backward run inside the
    # step, and the update after the closure's backward is the optimizer's, where Adam creates its state
    torch.manual_seed(0)
    model = nn.Linear(512, 512)  # 1 MiB of weights: Adam's two state buffers cross a 3.5 MiB limit
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(16, 512)

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        return loss

    with torchscalpel.memory(steps=None, out=tmp_path, memory_limit="3.5MiB", report=False) as run:
        for _ in range(3):
            opt.step(closure)
    oom = run.record.sections["memory"]["oom"]
    assert oom["request"]["phase"] == "optimizer"


def test_the_first_forward_inside_a_closure_step_starts_the_training_peak(tmp_path: Path) -> None:
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = model(torch.randn(8, 64)).square().mean()
        loss.backward()
        return loss

    with torchscalpel.memory(steps=2, warmup=0, out=tmp_path, report=False) as run:
        data = torch.empty(2**20) / 2.0  # 8 MiB at once before training
        del data
        for _ in range(3):
            opt.step(closure)  # the first forward runs inside the optimizer's step
    m = run.record.sections["memory"]
    assert (
        m["before_training"]["total"] >= 8 * 2**20 and m["peak"]["by_category"]["parameters"] == 64 * 65 * 4
    )


def _deep_mlp_steps(tmp: Path, *, accumulate: bool) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(
        *[m for _ in range(8) for m in (nn.Linear(512, 512), nn.ReLU())]
    )  # 8 MiB of weights
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscalpel.memory(steps=None, out=tmp, memory_limit="26MiB", report=False) as run:
        for _ in range(3):
            if (
                accumulate
            ):  # two micro-batches, zero_grad after the step: the second forward holds summed grads
                for _micro in range(2):
                    (model(torch.randn(512, 512)).square().mean() / 2).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:  # zero_grad between forward and backward: the forward holds the last step's grads
                loss = model(torch.randn(512, 512)).square().mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    return run.record.sections["memory"]["oom"]


def test_set_to_none_is_offered_for_stale_gradients_not_for_accumulated_ones(tmp_path: Path) -> None:
    stale = _deep_mlp_steps(tmp_path / "stale", accumulate=False)
    summed = _deep_mlp_steps(tmp_path / "accumulate", accumulate=True)
    assert stale["request"]["phase"] == summed["request"]["phase"] == "forward"
    assert stale["by_category"]["gradients"] > 0 and summed["by_category"]["gradients"] > 0
    assert "set-to-none" in {r["kind"] for r in stale["ladder"]}
    assert "set-to-none" not in {r["kind"] for r in summed["ladder"]}


def test_under_a_limit_every_step_is_accounted_as_in_the_cli() -> None:
    import torchscalpel

    assert torchscalpel.memory().options.steps == 20
    assert torchscalpel.memory(memory_limit="1GiB").options.steps is None  # growth may cross the limit late
    assert torchscalpel.memory(memory_limit="1GiB", steps=5).options.steps == 5

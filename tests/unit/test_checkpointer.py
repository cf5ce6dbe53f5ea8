"""Checkpointer on one rank: exact resume, refusals, partial state, SIGTERM, async, consolidate, guard."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from torchscalpel import distributed as sd
from torchscalpel.distributed import manifest


class Noisy(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.randn(4) + i


def _parts(lr=0.05):
    torch.manual_seed(0)
    model = sd.wrap(nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.Linear(8, 1)), "none")
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    data = sd.loader(Noisy(), 4, seed=0)
    return model, opt, sched, data


def _train(model, opt, sched, data, steps, ckpt=None, start=0, every=0):
    losses = []
    step = start
    while step < steps:
        for x in data:
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            losses.append(loss.item())
            if ckpt is not None:
                ckpt.maybe_save(step, every=every)
            if step >= steps:
                break
    return losses


def test_resume_is_exact(single_rank, tmp_path):
    ref_parts = _parts()
    ref = _train(*ref_parts, steps=12)
    model, opt, sched, data = _parts()
    ckpt = sd.Checkpointer(
        tmp_path, model=model, optimizer=opt, scheduler=sched, loader=data, sigterm=False, keep=2
    )
    first = _train(model, opt, sched, data, steps=7, ckpt=ckpt, every=5)
    assert [p.name for _, p in manifest.committed_steps(tmp_path)] == ["step-000000005"]
    # A fresh process would rebuild everything and load; the RNG is deliberately disturbed first.
    torch.manual_seed(123)
    model2, opt2, sched2, data2 = _parts()
    ckpt2 = sd.Checkpointer(
        tmp_path, model=model2, optimizer=opt2, scheduler=sched2, loader=data2, sigterm=False
    )
    assert ckpt2.load() == 5
    rest = _train(model2, opt2, sched2, data2, steps=12, start=5)
    assert first[:5] + rest == ref
    for a, b in zip(ref_parts[0].state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert sched2.state_dict() == ref_parts[2].state_dict()


def test_no_checkpoint_returns_none_and_keep_prunes(single_rank, tmp_path):
    model, opt, _sched, _data = _parts()
    ckpt = sd.Checkpointer(tmp_path, model=model, optimizer=opt, keep=2, sigterm=False)
    assert ckpt.load() is None
    for step in (1, 2, 3):
        ckpt.save(step)
    assert [s for s, _ in manifest.committed_steps(tmp_path)] == [3, 2]
    with pytest.raises(sd.CheckpointError, match="never overwritten"):
        ckpt.save(3)


def test_tampered_checkpoint_is_refused(single_rank, tmp_path):
    model, opt, _, _ = _parts()
    ckpt = sd.Checkpointer(tmp_path, model=model, optimizer=opt, sigterm=False)
    folder = ckpt.save(1)
    distcp = next(folder.glob("*.distcp"))
    blob = bytearray(distcp.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    distcp.write_bytes(bytes(blob))
    with pytest.raises(sd.CheckpointError, match="does not match its SHA-256"):
        ckpt.load()


def test_missing_state_needs_allow_partial(single_rank, tmp_path):
    model, opt, sched, _ = _parts()
    sd.Checkpointer(tmp_path, model=model, optimizer=opt, sigterm=False).save(1)
    strict = sd.Checkpointer(tmp_path, model=model, optimizer=opt, scheduler=sched, sigterm=False)
    with pytest.raises(sd.CheckpointError, match="no scheduler state"):
        strict.load()
    lenient = sd.Checkpointer(
        tmp_path, model=model, optimizer=opt, scheduler=sched, sigterm=False, allow_partial=True
    )
    assert lenient.load() == 1


def test_sigterm_saves_and_exits_143(single_rank, tmp_path):
    model, opt, sched, data = _parts()
    ckpt = sd.Checkpointer(tmp_path, model=model, optimizer=opt, scheduler=sched, loader=data)
    assert ckpt.maybe_save(1, every=0) is False
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(SystemExit) as exc:
        ckpt.maybe_save(2, every=0)
    assert exc.value.code == 143
    assert manifest.latest(tmp_path).name == "step-000000002"


def test_async_save_commits_on_wait(single_rank, tmp_path):
    model, opt, _sched, _data = _parts()
    ckpt = sd.Checkpointer(tmp_path, model=model, optimizer=opt, async_save=True, sigterm=False)
    ckpt.save(4)
    ckpt.wait()
    assert manifest.latest(tmp_path).name == "step-000000004"
    assert manifest.check(manifest.latest(tmp_path)) is None


def test_consolidate_writes_clean_keys(single_rank, tmp_path):
    model, opt, _, _ = _parts()
    sd.Checkpointer(tmp_path / "ck", model=model, optimizer=opt, sigterm=False).save(1)
    out = sd.consolidate(tmp_path / "ck", tmp_path / "model.safetensors")
    weights = load_file(str(out))
    assert set(weights) == set(model.state_dict())
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    with pytest.raises(sd.CheckpointError, match="no committed checkpoint"):
        sd.consolidate(tmp_path / "nothing", tmp_path / "x.safetensors")


def test_clean_key():
    from torchscalpel.distributed.consolidation import clean_key

    assert clean_key("module._orig_mod.layers.0._checkpoint_wrapped_module.w") == "layers.0.w"


def test_guard_halts_or_skips(single_rank, tmp_path):
    model, opt, sched, _ = _parts()
    guard = sd.NonFiniteGuard(model)
    loss = model(torch.full((2, 4), float("nan"))).mean()
    loss.backward()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(sd.NonFiniteError, match="Non-finite loss"):
        guard.step(opt, loss, scheduler=sched)
    skip = sd.NonFiniteGuard(model, mode="skip")
    assert skip.step(opt, loss, scheduler=sched) is False
    assert skip.skipped == 1 and sched.last_epoch == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # Finite loss but a poisoned gradient is caught too.
    good = model(torch.ones(2, 4)).mean()
    opt.zero_grad()
    good.backward()
    next(model.parameters()).grad[0, 0] = float("inf")
    assert skip.step(opt, good, scheduler=sched) is False and skip.skipped == 2
    good = model(torch.ones(2, 4)).mean()
    opt.zero_grad()
    good.backward()
    assert skip.step(opt, good, scheduler=sched) is True and sched.last_epoch == 1
    ckpt = sd.Checkpointer(tmp_path, model=model, optimizer=opt, scheduler=sched, guard=skip, sigterm=False)
    ckpt.save(3)
    fresh = sd.NonFiniteGuard(model, mode="skip")
    sd.Checkpointer(tmp_path, model=model, optimizer=opt, scheduler=sched, guard=fresh, sigterm=False).load()
    assert fresh.skipped == 2

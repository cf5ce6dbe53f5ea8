"""loader(): resumable position, epoch advance, per-sample seeding, caller's RNG untouched."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from torchscalpel import distributed as sd
from torchscalpel.errors import UsageError

pytestmark = pytest.mark.dist  # these tests start a one-rank process group


class Noisy(torch.utils.data.Dataset):
    """Each sample carries random draws from torch, numpy and random (an augmentation)."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.tensor([float(i), torch.rand(()).item(), float(np.random.rand()), random.random()])


def _take(loader, n):
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def test_resume_mid_epoch_gives_the_same_batches(single_rank):
    full = sd.loader(Noisy(), 4, seed=3)
    reference = _take(full, 6) + _take(full, 4)  # 6 = one epoch (24/4); then 4 of epoch 1
    part = sd.loader(Noisy(), 4, seed=3)
    first = _take(part, 6) + _take(part, 2)  # a whole epoch, then 2 batches of epoch 1
    state = part.state_dict()
    assert state["epoch"] == 1 and state["batches_done"] == 2
    resumed = sd.loader(Noisy(), 4, seed=3)
    resumed.load_state_dict(state)
    rest = _take(resumed, 2)
    for a, b in zip(reference, first + rest, strict=True):
        assert torch.equal(a, b)


def test_epochs_differ_and_advance_by_themselves(single_rank):
    loader = sd.loader(Noisy(), 4, seed=0)
    e0 = torch.cat(list(loader))
    e1 = torch.cat(list(loader))
    assert loader.epoch == 2 and len(loader) == 6
    assert sorted(e0[:, 0].tolist()) == sorted(e1[:, 0].tolist()) == [float(i) for i in range(24)]
    assert not torch.equal(e0[:, 0], e1[:, 0])  # reshuffled


def test_samples_do_not_depend_on_workers(single_rank):
    zero = torch.cat(list(sd.loader(Noisy(), 4, seed=1, num_workers=0)))
    two = torch.cat(list(sd.loader(Noisy(), 4, seed=1, num_workers=2)))
    assert torch.equal(zero, two)


def test_iteration_leaves_callers_generators_alone(single_rank):
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    list(sd.loader(Noisy(), 4, seed=1))
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(expected[0], got[0]) and expected[1:] == got[1:]


def test_refusals(single_rank):
    with pytest.raises(UsageError, match="sampler"):
        sd.loader(Noisy(), 4, shuffle=True, sampler=None)
    with pytest.raises(UsageError, match="persistent_workers"):
        sd.loader(Noisy(), 4, num_workers=1, persistent_workers=True)
    loader = sd.loader(Noisy(), 4, seed=1)
    with pytest.raises(UsageError, match="same values"):
        loader.load_state_dict({"epoch": 0, "batches_done": 1, "seed": 2, "batch_size": 4, "num_replicas": 1})

"""scalpel batch's pure parts: the lr scaling advice, the best size, the options, the forced batch size."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchscalpel.tune.batch_finder import BatchOptions, ForcedBatch, best_size, not_resized, scaling_advice


def test_linear_for_sgd_square_root_for_adam_never_applied() -> None:
    assert "linearly" in scaling_advice("SGD", 32, 128) and "x4 " in scaling_advice("SGD", 32, 128)
    adam = scaling_advice("Adam", 32, 128)
    assert "square root" in adam and "x2 " in adam and "not applied" in adam
    assert "no standard rule" in scaling_advice("LBFGS", 32, 64)
    assert scaling_advice(None, 32, 64).startswith("no advice")


def test_best_size_skips_what_did_not_fit() -> None:
    rows = [
        {"batch_size": 8, "fits": True, "samples_per_s": 100.0},
        {"batch_size": 32, "fits": True, "samples_per_s": 300.0},
        {"batch_size": 128, "fits": False, "samples_per_s": None},
    ]
    assert best_size(rows) == 32
    assert best_size(rows[2:]) is None


def test_options_refuse_bad_sizes() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BatchOptions(sizes=(0, 8))
    with pytest.raises(ValueError, match="twice"):
        BatchOptions(sizes=(8, 8))


def test_every_loader_gets_the_size_and_the_scripts_own_is_kept() -> None:
    data = TensorDataset(torch.zeros(100, 2))
    forced = ForcedBatch(25)
    undo = forced()
    try:
        positional = DataLoader(data, 10)
        keyword = DataLoader(data, batch_size=5, shuffle=False)
        sampler = DataLoader(data, batch_sampler=[[0, 1], [2, 3]])
    finally:
        undo()
    assert positional.batch_size == 25 and keyword.batch_size == 25
    assert forced.original == 10 and forced.untouched == 1 and sampler.batch_size is None
    assert DataLoader(data, batch_size=5).batch_size == 5  # undone


def test_a_size_no_loader_took_is_not_measured() -> None:
    """A script that builds no DataLoader (or only batch_sampler ones) runs its own batch at every size: the
    finder must not name a best size from runs that all measured the same thing."""
    data = TensorDataset(torch.zeros(100, 2))
    forced = ForcedBatch(64)
    undo = forced()
    try:
        DataLoader(data, batch_sampler=[[0, 1]])
    finally:
        undo()
    assert forced.forced == 0
    reason = not_resized(forced)
    assert reason is not None and reason.startswith(
        "not measured: the script's 1 DataLoader(s) were built with"
    )
    none = not_resized(ForcedBatch(64))
    assert none is not None and "built no DataLoader, so batch 64 was never set" in none
    taken = ForcedBatch(8)
    undo = taken()
    try:
        DataLoader(data, batch_size=4)
    finally:
        undo()
    assert taken.forced == 1 and not_resized(taken) is None
    assert scaling_advice("SGD", 32, None).startswith("not measured: no batch size was measured")

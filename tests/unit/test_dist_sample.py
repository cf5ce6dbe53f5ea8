"""wrap's sample batch follows the model to its device (users build it before wrap moves the model)."""

from __future__ import annotations

from collections import namedtuple

import torch

from torchscalpel.distributed.wrapping import _to_device

Batch = namedtuple("Batch", "x y")


def test_every_tensor_in_a_nested_sample_moves_and_containers_keep_their_type():
    sample = {"a": torch.ones(2), "b": [torch.zeros(1), 3], "c": Batch(torch.ones(1), "label")}
    moved = _to_device(sample, torch.device("meta"))
    assert moved["a"].is_meta and moved["b"][0].is_meta and moved["b"][1] == 3
    assert isinstance(moved["c"], Batch) and moved["c"].x.is_meta and moved["c"].y == "label"
    assert not sample["a"].is_meta  # the caller's batch is left as it was

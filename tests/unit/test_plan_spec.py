"""Batch specs, factory arguments and devices: what the user types for `scalpel plan` (MODULE:NAME: test_loading.py)."""

from __future__ import annotations

import pytest
import torch

from torchscalpel.errors import UsageError
from torchscalpel.plan.devices import resolve_device
from torchscalpel.plan.spec import parse_batch_spec, parse_factory_args


def test_batch_spec_parses_entries_dtypes_shapes_and_bounds():
    spec = parse_batch_spec("x=float32[8,3,32,32], y=int64[8]:10")
    x, y = spec.entries
    assert (x.name, x.dtype, x.shape, x.high) == ("x", torch.float32, (8, 3, 32, 32), None)
    assert (y.name, y.dtype, y.shape, y.high) == ("y", torch.int64, (8,), 10)
    assert spec.batch_size == 8
    assert spec.text() == "x=float32[8,3,32,32],y=int64[8]:10"


def test_with_batch_scales_dimension_zero_only():
    spec = parse_batch_spec("idx=int64[4,128]:50257").with_batch(16)
    assert spec.entries[0].shape == (16, 128)
    assert spec.entries[0].high == 50257


def test_made_tensors_follow_the_spec():
    tensors = parse_batch_spec("x=bf16[2,5],y=int64[2]:3").make("cpu")
    assert tensors["x"].dtype == torch.bfloat16 and tensors["x"].shape == (2, 5)
    assert tensors["y"].dtype == torch.int64 and int(tensors["y"].max()) < 3


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("x=float32(8,3)", "Cannot read batch entry"),
        ("x=float33[8]", "Unknown dtype"),
        ("x=float32[8,a]", "non-integer dimension"),
        ("x=float32[8,0]", "positive"),
        ("x=float32[8]:10", "only applies to integer"),
        ("x=float32[8],x=float32[8]", "appears twice"),
        ("x=float32[8],y=int64[4]", "disagree on dimension 0"),
    ],
)
def test_malformed_batch_specs_raise_usage_errors(text, needle):
    with pytest.raises(UsageError, match=needle):
        parse_batch_spec(text)


def test_factory_args_must_be_a_json_object():
    assert parse_factory_args('{"depth": 2}') == {"depth": 2}
    assert parse_factory_args(None) == {}
    for bad in ("[1]", "{depth: 2}"):
        with pytest.raises(UsageError, match="--factory-args"):
            parse_factory_args(bad)


def test_devices_by_name_memory_and_errors():
    a100 = resolve_device("a100-80gb", None)
    assert a100.name == "A100-80GB" and a100.memory == 81920 * 1024**2 and a100.kind == "cuda"
    assert a100.needed(10 * 1024**3) == int(10 * 1024**3 * 1.08) + 1024**3 // 2
    custom = resolve_device(None, "24GiB")
    assert custom.memory == 24 * 1024**3
    assert resolve_device(None, "40GB").memory == 40 * 10**9  # SI: 10^9, the units.parse_size rule
    with pytest.raises(UsageError, match="--device-memory '24G' is not a size"):
        resolve_device(None, "24G")
    assert resolve_device("cpu", None).kind == "cpu"
    with pytest.raises(UsageError, match="Unknown device 'Z9000'"):
        resolve_device("Z9000", None)
    with pytest.raises(UsageError, match="either"):
        resolve_device("L4", "24GiB")


def test_batch_names_are_matched_through_ddp_style_wrappers():
    from torch import nn

    from torchscalpel.plan.model_io import split_batch

    class Inner(nn.Module):
        def forward(self, input_ids=None, labels=None):
            return input_ids

    class Wrapper(
        nn.Module
    ):  # like DistributedDataParallel: forward(*inputs, **kwargs), the model in .module
        def __init__(self) -> None:
            super().__init__()
            self.module = Inner()

        def forward(self, *inputs, **kwargs):
            return self.module(*inputs, **kwargs)

    batch = {"input_ids": torch.zeros(2, 3), "labels": torch.zeros(2, 3)}
    args, kwargs, targets = split_batch(Wrapper(), batch)
    assert args == [] and set(kwargs) == {"input_ids", "labels"} and targets == []

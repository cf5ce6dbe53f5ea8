"""--example parsing and batch generation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from torchscalpel.errors import UsageError
from torchscalpel.ship.specs import make_batch, parse_example, parse_examples


def test_random_specs():
    (x,) = parse_example("float32[1,1,8,8]")
    assert x.name is None and x.dtype == torch.float32 and x.shape == (1, 1, 8, 8)
    (ids,) = parse_example("ids=int64[2, 16]:5..9")
    assert ids.name == "ids" and (ids.low, ids.high) == (5, 9)
    a, b = make_batch([x, ids], 7)
    assert a.shape == (7, 1, 8, 8) and b.shape == (7, 16) and b.min() >= 5 and b.max() < 9
    torch.testing.assert_close(make_batch([x], 7)[0], a)  # reproducible


def test_file_specs(tmp_path):
    arr = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "x.npy", arr)
    (x,) = parse_example(f"x={tmp_path / 'x.npy'}")
    (big,) = make_batch([x], 7)
    assert big.shape == (7, 4)
    np.testing.assert_array_equal(big[3].numpy(), arr[0])  # rows repeat
    save_file({"a": torch.zeros(2, 3), "b": torch.ones(2, 1)}, str(tmp_path / "ex.safetensors"))
    names = [i.name for i in parse_example(str(tmp_path / "ex.safetensors"))]
    assert names == ["a", "b"]


@pytest.mark.parametrize(
    "spec", ["float32", "complex64[1,2]", "float32[0,3]", "int64[1,2]:5..5", "missing.npy", "x.txt"]
)
def test_bad_specs(spec):
    with pytest.raises(UsageError):
        parse_example(spec)


def test_pickled_npy_refused(tmp_path):
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(UsageError, match=r"np\.save"):
        parse_example(str(tmp_path / "o.npy"))


def test_no_examples():
    with pytest.raises(UsageError):
        parse_examples([])

"""Request decoding and validation: every malformed body is a 422 (or 415) with a reason."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from torchscalpel.serve.codec import InputSpec, decode
from torchscalpel.serve.errors import RequestError

X = InputSpec(name="x", dtype=np.dtype("float32"), shape=(None, 1, 8, 8))
TOK = InputSpec(name="ids", dtype=np.dtype("int64"), shape=(None, 4), low=0, high=100)


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def err(body: bytes, ctype: str = "application/json", specs=(X,), max_batch: int = 8) -> RequestError:
    with pytest.raises(RequestError) as info:
        decode(body, ctype, list(specs), max_batch)
    return info.value


def test_json_valid_single_and_named():
    x = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)
    (a,) = decode(json.dumps({"inputs": x.tolist()}).encode(), "application/json", [X], 8)
    (b,) = decode(
        json.dumps({"inputs": {"x": x.tolist()}}).encode(), "application/json; charset=utf-8", [X], 8
    )
    assert a.dtype == np.float32 and a.shape == (3, 1, 8, 8)
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, x)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"not json", "not valid JSON"),
        (b"[1,2]", '"inputs"'),
        (b'{"inputs": 3}', "nested"),
        (json.dumps({"inputs": [[[[0.0] * 8] * 8]] * 9}).encode(), "batch of 9"),
        (json.dumps({"inputs": [[[[0.0] * 7] * 8]]}).encode(), "dimension 3"),
        (json.dumps({"inputs": [[[0.0] * 8] * 8]}).encode(), "3 dimensions"),
        (b'{"inputs": [[[[NaN, 1, 1, 1, 1, 1, 1, 1]]]]}', "dimension 2"),
        (json.dumps({"inputs": [[[[float("nan")] * 8] * 8]]}).encode(), "NaN"),
        (json.dumps({"inputs": [[[[1e39] * 8] * 8]]}).encode(), "too large"),
        (json.dumps({"inputs": [[[["a"] * 8] * 8]]}).encode(), "numbers"),
        (json.dumps({"inputs": [[[[1.0] * 8] * 7 + [[1.0] * 3]]]}).encode(), "rectangular"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (json.dumps({"inputs": {"x": [], "y": []}}).encode(), "unknown y"),
        (b'{"inputs": [1' + b"1" * 5000 + b"]}", "not valid JSON"),
    ],
)
def test_json_rejections(body, needle):
    e = err(body)
    assert e.status == 422
    assert needle in e.reason


def test_int_input_range_and_kind():
    ok = decode(json.dumps({"inputs": [[1, 2, 3, 99]]}).encode(), "application/json", [TOK], 8)
    assert ok[0].dtype == np.int64
    assert "outside" in err(json.dumps({"inputs": [[1, 2, 3, 100]]}).encode(), specs=(TOK,)).reason
    assert "integers" in err(json.dumps({"inputs": [[1.5, 2, 3, 4]]}).encode(), specs=(TOK,)).reason


def test_multi_input_batch_mismatch():
    y = InputSpec(name="y", dtype=np.dtype("float32"), shape=(None, 2))
    body = json.dumps({"inputs": {"x": [[[[0.0] * 8] * 8]] * 2, "y": [[1.0, 2.0]]}}).encode()
    assert "different batch sizes" in err(body, specs=(X, y)).reason


def test_npy_valid_and_big_endian():
    x = np.arange(2 * 64, dtype=np.float32).reshape(2, 1, 8, 8)
    (a,) = decode(npy(x), "application/x-npy", [X], 8)
    np.testing.assert_array_equal(a, x)
    (b,) = decode(npy(x.astype(">f4")), "application/octet-stream", [X], 8)
    np.testing.assert_array_equal(b, x)


def test_npy_rejections():
    x = np.zeros((2, 1, 8, 8), np.float32)
    good = npy(x)
    assert "promises" in err(good[:-5], "application/x-npy").reason  # truncated
    assert "promises" in err(good + b"xx", "application/x-npy").reason
    assert "not a valid .npy" in err(b"\x93NUMPY garbage", "application/x-npy").reason
    assert "not a valid .npy" in err(b"", "application/x-npy").reason
    # A header that claims a huge shape: rejected from the header alone, nothing allocated.
    huge = good.replace(b"(2, 1, 8, 8)", b"(2000000000, 1, 8, 8)")
    assert "shape" in err(huge, "application/x-npy").reason
    neg = good.replace(b"(2, 1, 8, 8)", b"(-2, 1, 8, 8)")
    assert err(neg, "application/x-npy").status == 422
    header_obj = good.replace(b"'<f4'", b"'|O' ")
    assert "object" in err(header_obj, "application/x-npy").reason
    assert "takes float32" in err(npy(np.full((1, 1, 8, 8), "a")), "application/x-npy").reason
    assert "takes float32" in err(npy(x.astype(np.int8)), "application/x-npy").reason
    assert "takes float32" in err(npy(x.astype(np.float64)), "application/x-npy").reason


def test_unsupported_content_type():
    e = err(b"x", "text/plain")
    assert e.status == 415

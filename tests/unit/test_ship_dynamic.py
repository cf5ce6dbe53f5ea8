"""--dynamic batch,seq and --opset: parsing, bounds from the model, parity at several lengths, serving two
lengths (the batcher never concatenates two lengths), and the one-sentence refusals."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from fixtures import text_model
from torchscalpel.errors import UsageError
from torchscalpel.serve.app import ServeConfig, create_app
from torchscalpel.serve.backends import check_runner, load_runner
from torchscalpel.serve.batcher import Batcher
from torchscalpel.ship.axes import Axis, check_opset, ort_max_opset, parse_dynamic
from torchscalpel.ship.bundle import verify_bundle
from torchscalpel.ship.export import ExportOptions, export_bundle

FIXTURE = Path(text_model.__file__)
JSON = {"content-type": "application/json"}


def test_parse_dynamic():
    assert parse_dynamic("batch") == [Axis("batch", 0)]
    assert parse_dynamic("none") == []
    assert parse_dynamic("batch,seq:512") == [Axis("batch", 0), Axis("seq", 1, 512)]
    assert parse_dynamic("batch,_,h,w") == [Axis("batch", 0), Axis("h", 2), Axis("w", 3)]
    for bad, words in [
        ("seq,batch", "first dimension must be 'batch'"),
        ("batch,seq,seq", "twice"),
        ("batch,se-q", "not a dimension name"),
        ("batch:4,seq", "--max-batch"),
    ]:
        with pytest.raises(UsageError, match=words):
            parse_dynamic(bad)


def test_opset_range_is_checked_against_the_installed_runtime():
    top = ort_max_opset()
    assert top >= 18
    check_opset(18)
    with pytest.raises(
        UsageError, match=r"--opset 12 is not supported here: torch's ONNX exporter writes opset 18"
    ):
        check_opset(12)
    with pytest.raises(UsageError, match=rf"runs up to opset {top}"):
        check_opset(top + 50)


@pytest.fixture(scope="module")
def text_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("dyn") / "bundle"
    opts = ExportOptions(
        model=f"{FIXTURE}:make",
        examples=["ids=int64[1,16]:0..100", "mask=float32[1,16]"],
        formats=("onnx",),
        dynamic="batch,seq",
        opset=20,
        max_batch=8,
        out=out,
    )
    return export_bundle(opts, log=lambda _: None)


def test_seq_axis_is_bounded_by_the_model_and_checked_at_several_lengths(text_bundle):
    m = text_bundle.manifest
    assert text_bundle.passed
    assert m["axes"]["seq"] == {"dim": 1, "min": 1, "max": 64, "example": 16, "checked": [1, 16, 64]}
    assert m["inputs"][0]["shape"] == [None, None] and m["inputs"][0]["dynamic_dims"] == {
        "0": "batch",
        "1": "seq",
    }
    assert m["outputs"][0]["shape"] == [None, 4] and m["outputs"][1]["shape"] == [None, None, 4]
    assert {c["sizes"] for c in m["parity"]["checks"]} == {"", "seq=1", "seq=64"}
    import onnxruntime

    assert m["onnx_opset"] == {
        "opset": 20,
        "runs_on": f"runs on the installed onnxruntime {onnxruntime.__version__} (checked); for an older runtime "
        "see onnxruntime's compatibility table (docs/reference/compatibility)",
    }


def test_served_at_two_lengths(text_bundle):
    b = verify_bundle(text_bundle.path)
    runner = load_runner(b, "onnxruntime")
    check_runner(b, runner)
    model = text_model.make().eval()
    with TestClient(create_app(b, runner, ServeConfig(max_batch=8, max_wait_ms=1))) as client:
        for length in (5, 40):
            ids = np.random.default_rng(length).integers(0, 100, (2, length))
            mask = np.ones((2, length), np.float32)
            r = client.post(
                "/v1/predict",
                content=json.dumps({"inputs": {"ids": ids.tolist(), "mask": mask.tolist()}}),
                headers=JSON,
            )
            assert r.status_code == 200, r.text
            with torch.inference_mode():
                want = model(torch.from_numpy(ids), torch.from_numpy(mask))[1].numpy()
            np.testing.assert_allclose(np.asarray(r.json()["outputs"]["output_1"]), want, atol=1e-5)
        too_long = {"inputs": {"ids": [[1] * 65], "mask": [[1.0] * 65]}}
        r = client.post("/v1/predict", content=json.dumps(too_long), headers=JSON)
        assert r.status_code == 422 and "size 65 in dimension 1; expected 1 to 64" in r.json()["error"]


def test_a_fixed_dimension_is_refused(tmp_path):
    opts = ExportOptions(
        model=f"{FIXTURE}:make_fixed",
        examples=["ids=int64[1,16]:0..100"],
        formats=("onnx",),
        dynamic="batch,seq",
        out=tmp_path / "b",
    )
    with pytest.raises(
        UsageError, match=r"the model fixes dimension 1 of input 'ids' to 16, so it cannot be dynamic"
    ):
        export_bundle(opts, log=lambda _: None)


def test_batcher_never_concatenates_two_lengths():
    calls: list[tuple[int, ...]] = []

    def run(inputs):
        calls.append(inputs[0].shape)
        return [inputs[0] * 2]

    async def main():
        b = Batcher(run, max_batch=8, max_wait_s=0.05, max_queue=16, timeout_s=5)
        b.start()
        outs = await asyncio.gather(
            b.submit([np.ones((1, 3))]), b.submit([np.ones((2, 5))]), b.submit([np.ones((1, 3))])
        )
        await b.stop()
        return outs

    outs = asyncio.run(main())
    assert [o[0].shape for o in outs] == [(1, 3), (2, 5), (1, 3)]
    assert sorted(calls) == [(2, 3), (2, 5)]

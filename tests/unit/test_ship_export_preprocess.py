"""export --transform end to end in-process: recorded as data, checked against the training transform on raw
samples, served on raw inputs by the app (same predictions as the training pipeline), 422 naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from fixtures import image_pipeline
from torchscalpel.serve.app import ServeConfig, create_app
from torchscalpel.serve.backends import load_runner
from torchscalpel.ship.bundle import verify_bundle
from torchscalpel.ship.export import ExportOptions, export_bundle
from torchscalpel.ship.transforms import training_batch

FIXTURE = Path(image_pipeline.__file__)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("pre") / "bundle"
    opts = ExportOptions(
        model=f"{FIXTURE}:make",
        examples=["float32[1,3,16,16]"],
        formats=("onnx",),
        max_batch=8,
        out=out,
        transform=f"{FIXTURE}:EVAL",
    )
    logs: list[str] = []
    result = export_bundle(opts, log=logs.append)
    return result, logs


def test_export_records_and_checks_the_transform(bundle):
    result, logs = bundle
    m = result.manifest
    assert result.passed
    assert [s["op"] for s in m["preprocessing"]["steps"]] == [
        "resize",
        "center_crop",
        "to_tensor",
        "normalize",
    ]
    assert m["preprocessing"]["source"].startswith("Resize, CenterCrop, ToTensor, Normalize from ")
    pre_checks = [c for c in m["parity"]["checks"] if c["format"] == "onnx+pre"]
    assert len(pre_checks) == 1 and pre_checks[0]["passed"] and pre_checks[0]["batch"] == 8
    assert m["preprocessing_parity"]["reference"] == "the training transform"
    assert m["preprocessing_parity"]["input_max_abs"] == 0.0
    assert any("raw sample(s) through the training transform" in line for line in logs)


def test_served_raw_pixels_equal_the_training_pipeline(bundle):
    result, _ = bundle
    b = verify_bundle(result.path)
    runner = load_runner(b, "onnxruntime")
    app = create_app(b, runner, ServeConfig(max_batch=8, max_wait_ms=1))
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (30, 24, 3), dtype=np.uint8) for _ in range(3)]
    model = image_pipeline.make().eval()
    import torch

    with torch.inference_mode():
        want = model(
            torch.from_numpy(training_batch(image_pipeline.EVAL, b.manifest["preprocessing"], images))
        ).numpy()
    with TestClient(app) as client:
        r = client.post(
            "/v1/predict",
            content=json.dumps({"raw": {"x": [i.tolist() for i in images]}}),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.asarray(r.json()["outputs"]["output"]), want, rtol=1e-4, atol=1e-5)
        bad = client.post(
            "/v1/predict",
            content=json.dumps({"raw": [np.zeros((8, 8, 4), int).tolist()]}),
            headers={"content-type": "application/json"},
        )
        assert bad.status_code == 422 and "raw input 'x' sample 0 has 4 channels" in bad.json()["error"]
        ragged = client.post(
            "/v1/predict",
            content=b'{"raw": {"x": [[[1, 2], [3]]]}}',
            headers={"content-type": "application/json"},
        )
        assert ragged.status_code == 422 and "'x' sample 0" in ragged.json()["error"]
        wrong = client.post(
            "/v1/predict", content=b'{"raw": {"y": []}}', headers={"content-type": "application/json"}
        )
        assert wrong.status_code == 422 and "'x'" in wrong.json()["error"]
        info = client.get("/v1/model").json()
        assert info["preprocessing"]["steps"][3]["op"] == "normalize"


def test_a_transform_that_does_not_do_what_it_says_fails_parity(tmp_path):
    opts = ExportOptions(
        model=f"{FIXTURE}:make",
        examples=["float32[1,3,16,16]"],
        formats=("exported",),
        max_batch=4,
        out=tmp_path / "b",
        transform=f"{FIXTURE}:LYING",
    )
    result = export_bundle(opts, log=lambda _: None)
    assert not result.passed
    failed = [c for c in result.checks if not c.passed]
    assert {c.format for c in failed} == {"exported+pre"}
    assert result.manifest["preprocessing_parity"]["input_max_abs"] > 1

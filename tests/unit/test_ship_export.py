"""export_bundle in-process on the digits CNN: formats, parity, manifest, hashes, failures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.digits_model import make_model
from torchscalpel.errors import RecordVersionError, ScalpelError, UsageError
from torchscalpel.ship.bundle import MANIFEST, verify_bundle
from torchscalpel.ship.export import ExportOptions, export_bundle
from torchscalpel.ship.runners import OrtRunner

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "digits_model.py"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    model = make_model(8)
    torch.save({"model": {f"module.{k}": v for k, v in model.state_dict().items()}}, tmp / "ckpt.pt")
    opts = ExportOptions(
        model=f"{FIXTURE}:make_model",
        factory_args='{"channels": 8}',
        weights=tmp / "ckpt.pt",
        examples=["float32[1,1,8,8]"],
        formats=("onnx", "exported", "torchscript"),
        max_batch=16,
        quantize="int8-dynamic",
        out=tmp / "bundle",
        output_names=["logits"],
        preprocess={"divide_by": 16},
    )
    logs: list[str] = []
    result = export_bundle(opts, log=logs.append)
    return result, model, logs


def test_bundle_contents_and_parity(exported):
    result, _, logs = exported
    assert result.passed
    m = result.manifest
    assert set(m["artifacts"]) == {"weights", "onnx", "exported", "torchscript", "onnx_int8"}
    assert {"model.onnx", "model.onnx.data", "model.pt2", "model.safetensors"} <= set(m["files"])
    assert m["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": [None, 1, 8, 8], "dynamic_dims": {"0": "batch"}}
    ]
    assert m["outputs"][0]["name"] == "logits" and m["outputs"][0]["shape"] == [None, 10]
    assert m["parity"]["batches"] == [1, 7, 16]
    formats = {(c["format"], c["batch"]) for c in m["parity"]["checks"]}
    assert formats == {(f, b) for f in ("onnx", "exported", "torchscript") for b in (1, 7, 16)}
    assert set(m["latency_ms"]) == {"1", "16"} and set(m["latency_ms"]["16"]) == {
        "eager",
        "onnx",
        "exported",
        "torchscript",
    }
    assert m["model"]["weights_loading"]["stripped_prefixes"] == {"module.": 6}
    assert any("module." in line for line in logs)
    # a line before each long phase, in order (a large export ran minutes without one)
    phases = [
        "exporting onnx ...",
        "exporting exported ...",
        "exporting torchscript ...",
        "parity: 3 format(s) vs eager at batch 1, 7, 16 ...",
        "int8: quantizing the ONNX export (int8-dynamic) ...",
        "latency: timing 4 form(s) at batch 1, 16 ...",
    ]
    assert [line for line in logs if line in phases] == phases, logs
    assert m["preprocessing"] == {"divide_by": 16}
    assert m["versions"]["torch"] == torch.__version__
    q = m["quantization"]
    assert q["method"] == "int8-dynamic" and q["speedup"] > 0 and 0 <= q["top1_agreement"] <= 1


def test_onnx_matches_eager_at_a_new_batch(exported):
    result, model, _ = exported
    x = torch.randn(5, 1, 8, 8)
    got = OrtRunner(result.path / "model.onnx")([x.numpy()])[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-4, rtol=1e-3)


def test_verify_detects_tampering_and_versions(exported, tmp_path):
    import shutil

    result, _, _ = exported
    copy = tmp_path / "b"
    shutil.copytree(result.path, copy)
    assert verify_bundle(copy).max_batch == 16
    data = bytearray((copy / "model.onnx.data").read_bytes())
    data[100] ^= 0xFF
    (copy / "model.onnx.data").write_bytes(bytes(data))
    with pytest.raises(ScalpelError, match=r"model\.onnx\.data has changed"):
        verify_bundle(copy)
    (copy / "model.onnx.data").unlink()
    with pytest.raises(ScalpelError, match="missing"):
        verify_bundle(copy)
    manifest = json.loads((result.path / MANIFEST).read_text())
    manifest["format_version"] = "2.0"
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RecordVersionError):
        verify_bundle(copy)
    manifest["format_version"] = "1.0"
    manifest["files"]["../escape"] = "0" * 64
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ScalpelError, match="outside"):
        verify_bundle(copy)


def test_parity_failure_is_reported_and_bundle_refused(tmp_path):
    opts = ExportOptions(
        model=f"{FIXTURE}:make_noisy",
        examples=["float32[2,4]"],
        formats=("exported",),
        max_batch=8,
        out=tmp_path / "noisy",
    )
    result = export_bundle(opts, log=lambda s: None)
    assert not result.passed
    assert all(not c.passed and c.max_abs > 1e-3 for c in result.checks)
    assert result.manifest["parity"]["passed"] is False
    with pytest.raises(ScalpelError, match="parity"):
        verify_bundle(tmp_path / "noisy")


def test_static_export_and_tolerance_override(tmp_path):
    opts = ExportOptions(
        model=f"{FIXTURE}:make_model",
        factory_args="[4]",
        examples=["float32[3,1,8,8]"],
        formats=("onnx",),
        dynamic="none",
        out=tmp_path / "static",
        atol=0.0,
        rtol=0.0,
    )
    result = export_bundle(opts, log=lambda s: None)
    assert result.manifest["inputs"][0]["shape"] == [3, 1, 8, 8] and result.manifest["max_batch"] == 3
    assert [c["batch"] for c in result.manifest["parity"]["checks"]] == [3]
    assert result.checks[0].atol == 0.0  # zero tolerance: passes only if onnxruntime is bit-exact here
    assert result.passed == (result.checks[0].max_abs == 0.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"formats": ("tflite",)}, "--formats"),
        ({"dynamic": "seq"}, "--dynamic"),
        ({"quantize": "int4"}, "--quantize"),
        ({"quantize": "int8-dynamic", "formats": ("exported",)}, "add onnx"),
        ({"max_batch": 0}, "--max-batch"),
        ({"atol": -1.0}, "--atol"),
    ],
)
def test_option_validation(kwargs, match):
    with pytest.raises(UsageError, match=match):
        ExportOptions(model="m:f", examples=["float32[1,2]"], **kwargs)


def test_user_errors(tmp_path):
    base = {"examples": ["float32[1,1,8,8]"], "out": tmp_path / "o"}
    with pytest.raises(UsageError, match=r"^--model 'nocolon' must be MODULE:NAME"):
        export_bundle(ExportOptions(model="nocolon", **base))
    with pytest.raises(UsageError, match=r"^--model: file .*missing\.py does not exist"):
        export_bundle(ExportOptions(model=f"{tmp_path / 'missing.py'}:make", **base))
    with pytest.raises(UsageError, match=r"^--model: .* has no attribute 'nothing_here'"):
        export_bundle(ExportOptions(model=f"{FIXTURE}:nothing_here", **base))
    with pytest.raises(UsageError, match=r"^--model: cannot import 'no_such_pkg_xyz' \(ModuleNotFoundError"):
        export_bundle(ExportOptions(model="no_such_pkg_xyz:make", **base))
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(
        UsageError, match=r"^--model: cannot import .*broken.py' \(RuntimeError: boom at import\)"
    ):
        export_bundle(ExportOptions(model=f"{tmp_path / 'broken.py'}:make", **base))
    with pytest.raises(UsageError, match=r"^--model: torch:__version__ is a TorchVersion, not callable"):
        export_bundle(ExportOptions(model="torch:__version__", **base))
    with pytest.raises(UsageError, match="not valid JSON"):
        export_bundle(ExportOptions(model=f"{FIXTURE}:make_model", factory_args="{", **base))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        export_bundle(
            ExportOptions(model=f"{FIXTURE}:make_model", examples=["float32[1,1,8,8]"], out=tmp_path / "full")
        )
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    with pytest.raises(UsageError, match="fails on the --example"):
        export_bundle(
            ExportOptions(
                model=f"{FIXTURE}:make_model",
                examples=["float32[1,1,8,8,2]"],
                formats=("exported",),
                out=tmp_path / "bad",
            )
        )
    assert not (tmp_path / "bad").exists()


def test_two_inputs_two_outputs_served(tmp_path):
    """Names from forward(), an int input with its range, two outputs: export, then the app answers like eager."""
    import json as _json

    from fastapi.testclient import TestClient
    from safetensors.torch import load_file

    from fixtures.digits_model import make_two_inputs
    from torchscalpel.serve.app import ServeConfig, create_app
    from torchscalpel.serve.backends import load_runner

    opts = ExportOptions(
        model=f"{FIXTURE}:make_two_inputs",
        examples=["int64[1,6]:0..50", "float32[1,3]"],
        formats=("onnx",),
        max_batch=8,
        out=tmp_path / "two",
    )
    result = export_bundle(opts, log=lambda s: None)
    assert result.passed
    m = result.manifest
    assert [i["name"] for i in m["inputs"]] == ["ids", "feats"] and m["inputs"][0]["range"] == [0, 50]
    assert [o["name"] for o in m["outputs"]] == ["output_0", "output_1"]
    bundle = verify_bundle(tmp_path / "two")
    model = make_two_inputs()
    model.load_state_dict(load_file(str(tmp_path / "two" / "model.safetensors")))
    ids = torch.randint(0, 50, (3, 6))
    feats = torch.randn(3, 3)
    with torch.no_grad():
        want = [t.numpy() for t in model.eval()(ids, feats)]
    app = create_app(bundle, load_runner(bundle, "onnxruntime"), ServeConfig())
    with TestClient(app) as c:
        r = c.post(
            "/v1/predict",
            content=_json.dumps({"inputs": {"ids": ids.tolist(), "feats": feats.tolist()}}),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 200, r.text
        out = r.json()["outputs"]
        np.testing.assert_allclose(out["output_0"], want[0], atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(out["output_1"], want[1], atol=1e-5, rtol=1e-4)
        bad = c.post(
            "/v1/predict",
            content=_json.dumps({"inputs": {"ids": [[50] * 6], "feats": [[0.0] * 3]}}),
            headers={"content-type": "application/json"},
        )
        assert bad.status_code == 422 and "outside [0, 49]" in bad.json()["error"]
        schema = c.get("/openapi.json").json()["paths"]["/v1/predict"]["post"]["requestBody"]["content"]
        assert "application/x-npy" not in schema  # .npy bodies carry one array: not offered for two inputs


def test_serve_backends_from_the_bundle(exported, tmp_path):
    import shutil

    from torchscalpel.serve.backends import load_runner

    result, model, _ = exported
    bundle = verify_bundle(result.path)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        want = model(x).numpy()
    for backend, kwargs, name in (
        ("onnxruntime", {}, "onnx"),
        ("onnxruntime", {"quantized": True}, "onnx_int8"),
        ("torch", {"trust": True}, "exported"),
    ):
        runner = load_runner(bundle, backend, **kwargs)
        assert runner.name == name
        got = runner([x.numpy()])[0]
        assert got.shape == (3, 10)
        if name != "onnx_int8":
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    with pytest.raises(UsageError, match="--trust"):
        load_runner(bundle, "torch")
    with pytest.raises(UsageError, match="onnxruntime"):
        load_runner(bundle, "torch", trust=True, quantized=True)
    # Without the .pt2, --backend torch falls back to the TorchScript file.
    copy = tmp_path / "b"
    shutil.copytree(result.path, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    del manifest["artifacts"]["exported"]
    (copy / MANIFEST).write_text(json.dumps(manifest))
    assert load_runner(verify_bundle(copy), "torch", trust=True).name == "torchscript"
    del manifest["artifacts"]["onnx"]
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match="no onnx file"):
        load_runner(verify_bundle(copy), "onnxruntime")


def test_quantization_input_drops_the_exporters_shape_annotations(exported, tmp_path):
    # onnxruntime 1.23 refused the exported model ("Inferred shape and existing shape differ") because of
    # the example batch's intermediate shapes; the quantizer gets a copy without them
    import onnx

    from torchscalpel.ship.quantize import _without_value_info

    result, _, _ = exported
    src = result.path / "model.onnx"
    original = onnx.load(str(src))
    copy = _without_value_info(src, tmp_path)
    assert len(onnx.load(str(copy)).graph.value_info) == 0
    assert len(onnx.load(str(copy)).graph.node) == len(original.graph.node)

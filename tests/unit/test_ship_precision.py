"""Reduced-precision forms (fp16 ONNX, bf16 torch program) kept only where parity holds within the stated
tolerance, a torch.compile'd .pt2 row with its parity, serve --precision/--compile, and TensorRT's row present
only where onnxruntime has the provider (absent here, with its reason; the code path through a fake list)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fixtures import conv_model
from torchscalpel.errors import UsageError
from torchscalpel.serve.backends import load_runner, warm_compiled
from torchscalpel.ship import precision
from torchscalpel.ship.bundle import verify_bundle
from torchscalpel.ship.export import ExportOptions, export_bundle
from torchscalpel.ship.runners import TRT_PROVIDER, gpu_forms, provider_list

MODEL = Path(conv_model.__file__)


def _export(out, **kw):
    opts = ExportOptions(
        model=f"{MODEL}:make",
        examples=["float32[1,3,32,32]"],
        formats=kw.pop("formats", ("onnx", "exported")),
        max_batch=8,
        out=out,
        **kw,
    )
    logs: list[str] = []
    return export_bundle(opts, log=logs.append), logs


@pytest.fixture(scope="module")
def half_bundle(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("half") / "b", precision=("fp16", "bf16"))


def test_each_precision_is_kept_only_where_parity_holds(half_bundle):
    result, logs = half_bundle
    assert result.passed  # a dropped reduced form never fails the fp32 bundle
    m = result.manifest
    for key in ("fp16", "bf16"):
        report = m["precision"][key]
        form, path = precision.FORM[key], result.path / precision.FILES[key]
        assert report["tolerance"] == list(precision.tolerance(key))
        assert report["reason"]
        if report["kept"]:
            assert report["parity_passed"] and path.is_file()
            assert m["artifacts"][precision.ARTIFACT[key]] == path.name and path.name in m["files"]
        else:
            assert not path.exists() and precision.ARTIFACT[key] not in m["artifacts"]
        if "parity_passed" in report:  # built and loaded: timed beside its fp32 peer in the same table
            for batch, row in m["latency_ms"].items():
                assert row[form] == report["latency_ms"][batch]
                assert report["speedup_vs_peer"][batch] == round(row[report["peer"]] / row[form], 3)
            assert report["peer"] == ("onnx" if key == "fp16" else "exported")
        assert any(line.startswith(f"{form}: ") for line in logs)
    assert m["precision"]["bf16"]["kept"]  # a small conv net in bf16 is within (2e-2, 2e-2)


def test_a_form_outside_its_tolerance_is_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "tolerance", lambda p: (0.0, 0.0))
    result, logs = _export(tmp_path / "b", precision=("bf16",))
    report = result.manifest["precision"]["bf16"]
    assert result.passed and report["kept"] is False and report["parity_passed"] is False
    assert report["reason"].startswith("outside the stated tolerance (atol 0, rtol 0)")
    assert (
        not (tmp_path / "b" / "model.bf16.pt2").exists()
        and "exported_bf16" not in result.manifest["artifacts"]
    )
    assert "pt2-bf16" in result.manifest["latency_ms"]["8"]  # the table says so either way
    assert any(line.startswith("pt2-bf16: dropped (outside the stated tolerance") for line in logs)


def test_serve_a_kept_bf16_program(half_bundle):
    result, _ = half_bundle
    b = verify_bundle(result.path)
    runner = load_runner(b, "torch", trust=True, precision="bf16")
    x = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
    got = runner([x])[0]
    fp32 = load_runner(b, "onnxruntime")([x])[0]
    assert got.dtype == np.float32 and np.allclose(got, fp32, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    ("backend", "kw", "words"),
    [
        (
            "torch",
            {"precision": "fp16", "trust": True},
            "--precision fp16 serves the fp16 ONNX model; use it with --backend onnxruntime",
        ),
        (
            "onnxruntime",
            {"precision": "bf16"},
            "--precision bf16 serves the bf16 torch program; use it with --backend torch",
        ),
        ("onnxruntime", {"compile": True}, "--compile compiles the torch program"),
        ("onnxruntime", {"precision": "fp16", "quantized": True}, "not with --quantized"),
    ],
)
def test_serve_precision_refusals(half_bundle, backend, kw, words):
    result, _ = half_bundle
    with pytest.raises(UsageError, match=words):
        load_runner(verify_bundle(result.path), backend, **kw)


def test_a_bundle_without_the_form_says_how_to_get_it(tmp_path):
    result, _ = _export(tmp_path / "b", formats=("onnx",))
    with pytest.raises(UsageError, match="export with --precision fp16"):
        load_runner(verify_bundle(result.path), "onnxruntime", precision="fp16")


def test_compiled_pt2_row_and_serve_compile(tmp_path, monkeypatch):
    """The plumbing with dynamo's aot_eager backend (tests/unit starts no compiler process; inductor's own run
    is tests/integration/test_ship_compile.py)."""
    real = precision.compiled
    monkeypatch.setattr(precision, "compiled", lambda r, name=None: real(r, name, backend="aot_eager"))
    result, logs = _export(tmp_path / "b", formats=("exported",), compile=True)
    m = result.manifest
    report = m["compile"]
    assert result.passed and report["form"] == "pt2+compile" and report["of"] == "exported"
    assert report["parity_passed"] is True and report["first_calls_s"] > 0, [
        c["note"] for c in report["checks"]
    ]
    assert all("pt2+compile" in row for row in m["latency_ms"].values())
    assert report["peer"] == "exported"
    assert any(line.startswith("pt2+compile: parity ok") for line in logs)
    b = verify_bundle(result.path)
    runner = load_runner(b, "torch", trust=True, compile=True)
    assert runner.name == "exported+compile" and type(runner.module).__name__ == "OptimizedModule"
    assert warm_compiled(b, runner, 8) == [1, 8]
    x = np.random.default_rng(1).random((3, 3, 32, 32), dtype=np.float32)
    np.testing.assert_allclose(
        runner([x])[0], load_runner(b, "torch", trust=True)([x])[0], rtol=1e-4, atol=1e-5
    )


def test_a_form_that_cannot_run_is_dropped_and_not_timed(tmp_path, monkeypatch):
    class Broken:
        def __init__(self, runner, name=None):
            self.name = name or f"{runner.name}+compile"

        def __call__(self, inputs):
            raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(precision, "compiled", Broken)
    result, logs = _export(tmp_path / "b", formats=("exported",), compile=True)
    report = result.manifest["compile"]
    assert result.passed and report["parity_passed"] is False
    assert report["reason"] == "failed to run: no C++ compiler found here"
    assert all("pt2+compile" not in row for row in result.manifest["latency_ms"].values())
    assert "pt2+compile: dropped (failed to run: no C++ compiler found here)" in logs


def test_tensorrt_row_only_where_the_provider_exists():
    rows, absent = gpu_forms(["CPUExecutionProvider"], "1.32.0")
    assert rows == [] and absent == {
        "onnx-cuda": "onnxruntime 1.32.0 has no CUDAExecutionProvider",
        "onnx-trt": f"onnxruntime 1.32.0 has no {TRT_PROVIDER}",
    }
    rows, absent = gpu_forms([TRT_PROVIDER, "CUDAExecutionProvider", "CPUExecutionProvider"], "1.x")
    assert rows == ["onnx-cuda", "onnx-trt"] and absent == {}
    rows, absent = gpu_forms(["CUDAExecutionProvider", "CPUExecutionProvider"], "1.x")
    assert rows == ["onnx-cuda"] and list(absent) == ["onnx-trt"]
    trt = provider_list("onnx-trt")
    assert (
        trt[0][0] == TRT_PROVIDER
        and trt[1][0] == "CUDAExecutionProvider"
        and trt[-1] == "CPUExecutionProvider"
    )
    assert provider_list("onnx") == ["CPUExecutionProvider"]


def test_the_manifest_says_why_trt_is_absent_here(half_bundle):
    import onnxruntime

    if TRT_PROVIDER in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime has TensorRT here: the row is present")
    result, _ = half_bundle
    absent = result.manifest["forms_absent"]
    assert absent["onnx-trt"] == f"onnxruntime {onnxruntime.__version__} has no {TRT_PROVIDER}"
    assert all("onnx-trt" not in row for row in result.manifest["latency_ms"].values())


def test_parse_precisions():
    assert precision.parse_precisions("bf16,fp16,bf16") == ("bf16", "fp16")
    assert precision.parse_precisions(None) == ()
    with pytest.raises(ValueError, match="--precision takes a comma list of fp16, bf16"):
        precision.parse_precisions("int4")


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--compile"], "--compile compiles the torch program; use it with --backend torch --trust."),
        (
            ["--precision", "bf16"],
            "--precision bf16 serves the bf16 torch program; use it with --backend torch.",
        ),
    ],
)
def test_serve_cli_refuses_before_binding(half_bundle, capsys, flags, words):
    from torchscalpel.cli.main import main

    result, _ = half_bundle
    assert main(["serve", str(result.path), "--port", "0", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"scalpel: error: {words}"

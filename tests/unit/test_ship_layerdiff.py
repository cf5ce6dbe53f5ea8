"""export --layer-diff: the first layer whose output differs between eager and an export, named with statistics;
run by itself on a parity failure."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fixtures import drift_model
from torchscalpel.ship.export import ExportOptions, export_bundle
from torchscalpel.ship.layerdiff import layer_diff, tensor_stats

FIXTURE = Path(drift_model.__file__)


def _export(tmp_path: Path, drift: bool, layer_diff: bool):
    logs: list[str] = []
    opts = ExportOptions(
        model=f"{FIXTURE}:make",
        factory_args=f'{{"drift": {str(drift).lower()}}}',
        examples=["float32[1,1,8,8]"],
        formats=("onnx", "exported"),
        max_batch=4,
        out=tmp_path / "b",
        layer_diff=layer_diff,
    )
    return export_bundle(opts, log=logs.append), logs


def test_a_parity_failure_names_the_layer_where_the_forms_part(tmp_path):
    result, logs = _export(tmp_path, drift=True, layer_diff=False)
    assert not result.passed
    diffs = {d["format"]: d for d in result.manifest["layer_diff"]}
    assert set(diffs) == {"onnx", "exported"}
    for fmt in ("onnx", "exported"):
        d = diffs[fmt]
        assert d["layer"] == "drift" and d["module"] == "Drift" and d["compared"] == 3  # conv1, act, drift
        assert d["max_abs"] > d["atol"] and d["eager"]["shape"] == [4, 4, 8, 8]
        assert abs(d["export"]["mean"] / d["eager"]["mean"] - 1.01) < 1e-3
    assert any(
        line.startswith("layer diff onnx: first layer beyond tolerance: drift (Drift)") for line in logs
    )


def test_layer_diff_on_request_reports_every_layer_within_tolerance(tmp_path):
    result, logs = _export(tmp_path, drift=False, layer_diff=True)
    assert result.passed
    onnx = next(d for d in result.manifest["layer_diff"] if d["format"] == "onnx")
    assert onnx["layer"] is None and onnx["compared"] >= 4
    assert any(line.startswith("layer diff onnx: all ") for line in logs)


def test_torchscript_has_no_module_paths(tmp_path):
    d = layer_diff(drift_model.make(), "torchscript", tmp_path / "m.pt", [np.zeros((1, 1, 8, 8), np.float32)])
    assert d.compared == 0 and "TorchScript keeps no module paths" in d.describe()


def test_tensor_stats():
    s = tensor_stats(np.array([[1.0, 3.0], [np.nan, 5.0]], np.float32))
    assert s == {
        "shape": [2, 2],
        "dtype": "float32",
        "mean": 3.0,
        "std": s["std"],
        "min": 1.0,
        "max": 5.0,
        "nonfinite": 1,
    }
    assert abs(s["std"] - np.std([1.0, 3.0, 5.0])) < 1e-12

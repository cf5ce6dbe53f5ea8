"""--quantize int8-static: calibrated QDQ int8 beside fp32 in the latency table, kept only when faster at every
timed batch and within the int8 tolerance (the rule, not the speed, is what these tests check)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fixtures import conv_model
from torchscalpel.errors import UsageError
from torchscalpel.ship import export as export_mod
from torchscalpel.ship.export import ExportOptions, export_bundle

FIXTURE = Path(conv_model.__file__)


def _opts(tmp_path: Path, **kw) -> ExportOptions:
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).standard_normal((24, 3, 32, 32)).astype(np.float32))
    return ExportOptions(
        model=f"{FIXTURE}:make",
        examples=["float32[1,3,32,32]"],
        formats=("onnx",),
        max_batch=8,
        quantize="int8-static",
        calibration=calib,
        out=tmp_path / "b",
        **kw,
    )


def test_static_int8_is_judged_by_the_latency_table(tmp_path):
    logs: list[str] = []
    result = export_bundle(_opts(tmp_path), log=logs.append)
    assert result.passed
    m = result.manifest
    q = m["quantization"]
    assert q["method"] == "int8-static" and q["calibration"] == "calib.npy (--calibration)"
    assert set(m["latency_ms"]) == {"1", "8"} and all("onnx-int8" in row for row in m["latency_ms"].values())
    assert q["speedups"] == {
        b: round(row["onnx"] / row["onnx-int8"], 3) for b, row in m["latency_ms"].items()
    }
    assert q["parity_passed"] is True and q["max_abs_error"] < 0.05
    assert q["kept"] == (all(v > 1 for v in q["speedups"].values()) and q["parity_passed"])
    assert ("onnx_int8" in m["artifacts"]) == q["kept"] == (result.path / "model.int8.onnx").exists()
    assert any(line.startswith(("int8: kept (", "int8: dropped (")) for line in logs)


def test_static_int8_slower_than_fp32_is_dropped_and_said_so(tmp_path, monkeypatch):
    real = export_mod.measure_latency

    def int8_slower(runners, inputs, **kw):
        times = real(runners, inputs, **kw)
        if "onnx-int8" in times:
            times["onnx-int8"] = times["onnx"] * 2
        return times

    monkeypatch.setattr(export_mod, "measure_latency", int8_slower)
    result = export_bundle(_opts(tmp_path), log=lambda _: None)
    q = result.manifest["quantization"]
    assert result.passed and q["kept"] is False and q["speedups"] == {"1": 0.5, "8": 0.5}
    assert q["reason"] == "not faster than fp32 ONNX at every timed batch"
    assert "onnx_int8" not in result.manifest["artifacts"] and not (result.path / "model.int8.onnx").exists()
    assert "model.int8.onnx" not in result.manifest["files"]


def test_calibration_needs_static(tmp_path):
    with pytest.raises(UsageError, match="--calibration feeds --quantize int8-static"):
        ExportOptions(model="m:f", examples=["float32[1,2]"], calibration=tmp_path / "c.npy")

"""Parity comparison: tolerances per dtype, failures carry the numbers."""

from __future__ import annotations

import numpy as np

from torchscalpel.ship.parity import compare, format_table, run_parity, tolerance_for


def test_tolerance_table_and_override():
    assert tolerance_for(np.dtype("float32")) == (1e-4, 1e-3)
    assert tolerance_for(np.dtype("int64")) == (0.0, 0.0)
    assert tolerance_for(np.dtype("float32"), (0.5, None)) == (0.5, 1e-3)


def test_compare_pass_and_fail_with_figures():
    want = np.array([[1.0, -2.0, 100.0]], np.float32)
    ok = compare("onnx", 1, ["y"], [want], [want + 1e-5])
    assert ok[0].passed and 0 < ok[0].max_abs < 2e-5
    bad = compare("onnx", 1, ["y"], [want], [want + np.array([[0, 0, 1.0]], np.float32)])
    assert not bad[0].passed and bad[0].max_abs == 1.0 and abs(bad[0].max_rel - 0.01) < 1e-9
    assert "FAIL" in format_table(bad)
    # The same error passes with a loose enough relative tolerance (1.0 <= 1e-4 + 0.02 * 100).
    assert compare("onnx", 1, ["y"], [want], [want + np.array([[0, 0, 1.0]], np.float32)], (None, 0.02))[
        0
    ].passed


def test_compare_shape_nan_and_int():
    want = np.zeros((2, 3), np.float32)
    assert not compare("x", 2, ["y"], [want], [np.zeros((2, 4), np.float32)])[0].passed
    got = want.copy()
    got[0, 0] = np.nan
    res = compare("x", 2, ["y"], [want], [got])[0]
    assert not res.passed and "NaN" in res.note
    ints = np.array([1, 2, 3])
    assert not compare("x", 3, ["k"], [ints], [ints + np.array([0, 0, 1])])[0].passed
    assert compare("x", 3, ["k"], [ints], [ints.copy()])[0].passed


def test_run_parity_records_a_crashing_export():
    class Eager:
        name = "eager"

        def __call__(self, inputs):
            return [inputs[0] * 2]

    class Broken:
        name = "broken"

        def __call__(self, inputs):
            raise RuntimeError("shape mismatch in Gemm")

    checks = run_parity(Eager(), [Broken()], {1: [np.ones((1, 2), np.float32)]}, ["y"])
    assert len(checks) == 1 and not checks[0].passed and "Gemm" in checks[0].note

"""The demo's ship stage: examples/digits_cnn.py trained briefly, exported, served locally, same answers."""

from __future__ import annotations

import pytest

from torchscalpel.stages.export_demo import run_ship_demo

pytestmark = pytest.mark.slow


def test_ship_demo_serves_what_eager_computes(tmp_path):
    lines: list[str] = []
    summary = run_ship_demo(tmp_path / "ship", steps=20, log=lines.append)
    check = summary["serve_check"]
    assert summary["parity_passed"]
    assert check["all_200"] and check["requests"] == 32
    assert check["matches_eager"] and check["same_argmax"]
    assert 1 <= check["batches"] <= 32
    assert any("same predictions as eager" in ln for ln in lines)

"""torch.compile for inference with inductor (it builds C++ kernels with the system compiler, a child process):
export's pt2+compile row with its parity, and serve's compiled runner warmed at batch 1 and the max batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fixtures import conv_model
from torchscalpel.serve.backends import load_runner, warm_compiled
from torchscalpel.ship.bundle import verify_bundle
from torchscalpel.ship.export import ExportOptions, export_bundle

pytestmark = pytest.mark.slow


def test_inductor_compiled_program_matches_and_serves(tmp_path):
    result = export_bundle(
        ExportOptions(
            model=f"{Path(conv_model.__file__)}:make",
            examples=["float32[1,3,32,32]"],
            formats=("exported",),
            max_batch=8,
            out=tmp_path / "b",
            compile=True,
        ),
        log=lambda _: None,
    )
    report = result.manifest["compile"]
    assert result.passed and report["parity_passed"] is True, [c["note"] for c in report["checks"]]
    assert report["max_abs"] < 1e-4 and set(report["speedup_vs_peer"]) == {"1", "8"}
    b = verify_bundle(result.path)
    runner = load_runner(b, "torch", trust=True, compile=True)
    assert warm_compiled(b, runner, 8) == [1, 8]
    x = np.random.default_rng(2).random((5, 3, 32, 32), dtype=np.float32)
    np.testing.assert_allclose(
        runner([x])[0], load_runner(b, "torch", trust=True)([x])[0], rtol=1e-4, atol=1e-5
    )

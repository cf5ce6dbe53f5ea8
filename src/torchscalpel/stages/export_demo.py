"""The ship stage of ``scalpel demo``: train the digits example briefly, export it, serve it, compare.

``run_ship_demo(out)`` runs ``examples/digits_cnn.py`` (plain PyTorch) for a few steps with
``--save``, exports the weights with :func:`torchscalpel.ship.export.export_bundle`, serves the
bundle on 127.0.0.1 and checks the served predictions against eager on real digits.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchscalpel.errors import ScalpelError


def run_ship_demo(
    out: Path, *, steps: int = 40, script: Path | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Train, export, serve-check; returns a summary (also the demo's record section).

    ``script`` is the digits example to use (default: the bundled one)."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    from torchscalpel.examples import example_script
    from torchscalpel.serve.selfcheck import serve_check
    from torchscalpel.ship.export import ExportOptions, export_bundle
    from torchscalpel.ship.factory import build_model

    script = script or example_script("digits_cnn.py")
    out.mkdir(parents=True, exist_ok=True)
    weights = out / "digits_cnn.pt"
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "--steps",
            str(steps),
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--save",
            str(weights),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not weights.exists():
        raise ScalpelError(
            f"The digits example failed to train (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
        )
    log(f"trained {script.name} for {steps} steps -> {weights}")
    result = export_bundle(
        ExportOptions(
            model=f"{script}:make_model",
            weights=weights,
            examples=["float32[1,1,8,8]"],
            formats=("onnx", "exported"),
            max_batch=32,
            out=out / "bundle",
            output_names=["logits"],
        ),
        log=log,
    )
    if not result.passed:
        raise ScalpelError(f"Parity failed for the demo export; see {out / 'bundle' / 'manifest.json'}.")
    x = torch.tensor(load_digits().images[:64], dtype=torch.float32).unsqueeze(1) / 16.0
    model = build_model(f"{script}:make_model")
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    with torch.no_grad():
        expected = model.eval()(x).numpy()
    check = serve_check(out / "bundle", x.numpy(), expected.astype(np.float32))
    log(
        f"served {check['requests']} requests in {check['batches']} batches: "
        f"{'same predictions as eager' if check['same_argmax'] else 'MISMATCH'} (max abs {check['max_abs_error']:.2g})"
    )
    return {
        "bundle": str(out / "bundle"),
        "parity_passed": result.passed,
        "latency_ms": result.manifest["latency_ms"],
        "serve_check": check,
    }

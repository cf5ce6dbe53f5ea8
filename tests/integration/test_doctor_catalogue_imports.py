"""The rule catalogue registers nothing on import: checked in a fresh interpreter, where no earlier test has
imported a rule module (moved from tests/unit/test_doctor_catalogue.py: it starts a Python process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_catalogue_has_no_import_side_effects() -> None:
    # In a fresh interpreter: importing doctor.static (the static rules' base) pulls in no rule module,
    # and importing (or reloading) static and the rule modules twice neither duplicates nor loses a rule.
    # The rules run from doctor.static_scan, which sits above the catalogue (no lazy import, no cycle).
    code = textwrap.dedent(
        """
        import importlib, sys
        from torchscalpel.doctor import static
        assert not [m for m in sys.modules if m.startswith(("torchscalpel.doctor.rules", "torchscalpel.doctor.catalogue"))]
        assert not hasattr(static, "STATIC_CHECKS")
        from torchscalpel.doctor import static_scan
        SRC = "import torch\\nimport torch.nn as nn\\ntorch.save(model, 'm.pt')\\nm = nn.DataParallel(model)\\n"
        first = [f.rule for f in static_scan.analyze_source(SRC, "t.py")]
        from torchscalpel.doctor import catalogue
        n_classes, slugs = len(catalogue.RULE_CLASSES), list(catalogue.RULES)
        static = importlib.reload(static)
        for name in ("model_static", "loop_static", "dist_static", "checkpoint_static"):
            importlib.import_module("torchscalpel.doctor.rules." + name)
            importlib.reload(sys.modules["torchscalpel.doctor.rules." + name])
        catalogue = importlib.reload(catalogue)
        static_scan = importlib.reload(static_scan)
        again = [f.rule for f in static_scan.analyze_source(SRC, "t.py")]
        assert first == again == ["dataparallel-used", "whole-model-save"], (first, again)
        assert len(catalogue.RULE_CLASSES) == n_classes and list(catalogue.RULES) == slugs
        print("ok")
        """
    )
    src = Path(__file__).resolve().parents[2] / "src"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr

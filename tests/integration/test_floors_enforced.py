"""``lint-imports`` keeps the floors: it passes on the tree as it is and fails on a planted upward import
(a lazy one, inside a function, which is what the floors were broken by before)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "src" / "torchscalpel",
        tree / "src" / "torchscalpel",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def test_the_tree_keeps_its_floors(tmp_path):
    proc = _lint(_copy(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_planted_lazy_upward_import_breaks_the_contract(tmp_path):
    tree = _copy(tmp_path)
    record = tree / "src" / "torchscalpel" / "record.py"
    record.write_text(
        record.read_text(encoding="utf-8")
        + "\n\ndef _planted() -> None:\n    from torchscalpel.report import html  # noqa: F401\n",
        encoding="utf-8",
    )
    proc = _lint(tree)
    assert proc.returncode != 0
    assert "torchscalpel.record is not allowed to import torchscalpel.report" in proc.stdout

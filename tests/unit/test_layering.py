"""Layers import only downward: nothing below ``torchscalpel.cli`` imports it (DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "torchscalpel"


def _imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in the file names, at any depth (lazy imports too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """``file: module`` for each import of torchscalpel.cli from outside cli/ (and the entry shims)."""
    allowed = {package / "__main__.py"}  # ``python -m torchscalpel`` is the CLI's own entry point
    found = []
    for path in sorted(package.rglob("*.py")):
        if path in allowed or (package / "cli") in path.parents:
            continue
        for name in sorted(_imported_modules(path)):
            if name == "torchscalpel.cli" or name.startswith("torchscalpel.cli."):
                found.append(f"{path.relative_to(package)}: {name}")
    return found


def test_nothing_below_the_cli_imports_it() -> None:
    assert upward_imports() == []


def test_the_check_sees_a_planted_upward_import(tmp_path: Path) -> None:
    pkg = tmp_path / "torchscalpel"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "cli" / "common.py").write_text("X = 1\n")
    (pkg / "runtime.py").write_text("def f():\n    from torchscalpel.cli.common import X\n    return X\n")
    assert upward_imports(pkg) == ["runtime.py: torchscalpel.cli.common", "runtime.py: torchscalpel.cli.common.X"]

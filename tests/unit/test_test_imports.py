"""The suite collects under plain ``pytest`` as under ``python -m pytest``: its shared modules (helpers,
block_models, ...) are imported by their own names through pyproject's ``pythonpath = ["tests"]``, never
as ``tests.helpers`` (a name only ``python -m``, which puts the working folder on sys.path, can find)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imports_of_the_tests_package(path: Path) -> list[int]:
    lines: list[int] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if any(name.split(".")[0] == "tests" for name in names):
            lines.append(node.lineno)
    return lines


def test_no_test_module_imports_the_tests_folder_as_a_package() -> None:
    found = {
        str(p.relative_to(TESTS)): n for p in TESTS.rglob("*.py") if (n := _imports_of_the_tests_package(p))
    }
    assert not found, found


def test_the_check_sees_such_an_import(tmp_path: Path) -> None:
    sample = tmp_path / "test_x.py"
    sample.write_text(
        "from tests.helpers import run_cli\nimport tests.block_models\nfrom helpers import REPO\n"
    )
    assert _imports_of_the_tests_package(sample) == [1, 2]

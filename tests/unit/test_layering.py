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


def _names_cli(text: str) -> bool:
    return text == "torchscalpel.cli" or text.startswith(
        ("torchscalpel.cli.", "torchscalpel.cli:", "torchscalpel/cli/")
    )


def upward_strings(package: Path = PACKAGE) -> list[str]:
    """``file:line: 'text'`` for each string constant below cli/ that names a torchscalpel.cli module
    (``python -m torchscalpel.cli.x`` started from library code is an upward dependency as much as an
    import is). Docstrings count too: one that tells a reader to run a cli module is the same promise."""
    allowed = {package / "__main__.py"}
    found = []
    for path in sorted(package.rglob("*.py")):
        if path in allowed or (package / "cli") in path.parents:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for word in node.value.replace("`", " ").replace("'", " ").replace('"', " ").split():
                    if _names_cli(word.rstrip(".,;:)")):
                        found.append(f"{path.relative_to(package)}:{node.lineno}: {word!r}")
    return found


def test_nothing_below_the_cli_imports_it() -> None:
    assert upward_imports() == []


def test_nothing_below_the_cli_names_it_in_a_string() -> None:
    assert upward_strings() == []


def test_the_string_check_sees_a_planted_module_string(tmp_path: Path) -> None:
    pkg = tmp_path / "torchscalpel"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "cli" / "entry.py").write_text('ME = "torchscalpel.cli.entry"\n')  # inside cli/: allowed
    (pkg / "__main__.py").write_text(
        '"""python -m torchscalpel runs torchscalpel.cli.main."""\n'
    )  # the entry point
    (pkg / "distributed").mkdir()
    (pkg / "distributed" / "launch.py").write_text(
        'def wrap(args):\n    args.training_script = "torchscalpel.cli.rank_entry"\n'
        'OTHER = "torchscalpel.client"  # not the cli package\n'
        'CMD = f"python -m torchscalpel.cli.x {1}"\n'
    )
    assert upward_strings(pkg) == [
        "distributed/launch.py:2: 'torchscalpel.cli.rank_entry'",
        "distributed/launch.py:4: 'torchscalpel.cli.x'",
    ]


def test_the_check_sees_a_planted_upward_import(tmp_path: Path) -> None:
    pkg = tmp_path / "torchscalpel"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "cli" / "common.py").write_text("X = 1\n")
    (pkg / "runtime.py").write_text("def f():\n    from torchscalpel.cli.common import X\n    return X\n")
    assert upward_imports(pkg) == [
        "runtime.py: torchscalpel.cli.common",
        "runtime.py: torchscalpel.cli.common.X",
    ]

"""docs/ARCHITECTURE.md's stage table is the code's: one row per ``scalpel`` verb, every name in it defined
where it says, every options class of the code in it, and each verb's CLI building its options through
``from_args``. Names are resolved from the sources (no import: serve's FastAPI need not be installed)."""

from __future__ import annotations

import argparse
import ast
import re
from functools import cache
from pathlib import Path

from torchscalpel.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "torchscalpel"
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _rows() -> dict[str, list[str]]:
    block = (
        DOC.read_text(encoding="utf-8")
        .split("<!-- stages:start -->", 1)[1]
        .split("<!-- stages:end -->", 1)[0]
    )
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| verb")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {c[0]: c[1:] for c in cells}


@cache
def _names_in(path: Path) -> frozenset[str]:
    """The names a module binds at its top level (definitions, assignments and imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def _module_file(parts: list[str]) -> Path | None:
    base = SRC.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolves(reference: str) -> bool:
    """``doctor.options.DoctorOptions``, ``report/html.write_report``, ``cli/env.py`` or ``report/launch_page``:
    the longest module prefix is a source file and the rest a name it binds at its top level."""
    parts = reference.removesuffix(".py").replace("/", ".").split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_file(parts[:cut])
        if path is not None:
            rest = parts[cut:]
            return not rest or (len(rest) == 1 and rest[0] in _names_in(path))
    return False


def _references(cell: str) -> list[str]:
    return [r for r in re.findall(r"`([^`]+)`", cell) if re.fullmatch(r"[a-z_]+([./][a-z_A-Z]+)+(\.py)?", r)]


def _options_classes_in_code() -> set[str]:
    """``module.Class`` of every class that derives from StageOptions (the run window's own excepted)."""
    found = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "StageOptions" for b in node.bases
            ):
                module = ".".join(path.relative_to(SRC).with_suffix("").parts)
                found.add(f"{module}.{node.name}")
    return found - {"runtime.window.StepWindow"}


def test_one_row_per_verb() -> None:
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert sorted(_rows()) == sorted(verbs)


def test_every_name_in_the_table_is_defined_where_it_says() -> None:
    missing = [
        (verb, ref)
        for verb, cells in _rows().items()
        for cell in cells
        for ref in _references(cell)
        if not _resolves(ref)
    ]
    assert not missing, missing
    assert not _resolves("doctor.options.NoSuchOptions") and not _resolves(
        "report/nope.build"
    )  # the check bites


def test_every_options_class_is_in_the_table_and_its_cli_builds_it_with_from_args() -> None:
    named = {verb: _references(cells[0]) for verb, cells in _rows().items()}
    listed = {ref for refs in named.values() for ref in refs}
    in_code = _options_classes_in_code()
    assert in_code and in_code <= listed, sorted(in_code - listed)
    for verb, refs in named.items():
        for ref in refs:
            if ref in in_code:
                cli = (SRC / "cli" / f"{verb}.py").read_text(encoding="utf-8")
                assert f"{ref.rsplit('.', 1)[1]}.from_args(" in cli, (verb, ref)


def test_one_name_per_renderer_kind() -> None:
    """Every terminal renderer the table names is ``report/<verb>_terminal.render`` and every HTML sections builder
    ``report/<stage>_sections.build``; so is every such module in the code (no second spelling hides there)."""
    terminal, sections = [], []
    for cells in _rows().values():
        terminal += [r for r in _references(cells[2]) if r.startswith("report/")]
        sections += [r for r in _references(cells[3]) if "_sections" in r]
    assert len(terminal) >= 10 and len(sections) >= 8
    wrong = [r for r in terminal if not re.fullmatch(r"report/[a-z]+_terminal\.render", r)]
    wrong += [r for r in sections if not re.fullmatch(r"report/[a-z]+_sections\.build", r)]
    assert not wrong, wrong
    for path in sorted((SRC / "report").glob("*_terminal.py")) + sorted(
        (SRC / "report").glob("*_sections.py")
    ):
        name = "render" if path.stem.endswith("_terminal") else "build"
        assert name in _names_in(path), f"{path.name} has no {name}()"

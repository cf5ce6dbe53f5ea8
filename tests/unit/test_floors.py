"""The floors of docs/ARCHITECTURE.md: every top-level module of the package sits on a declared floor
of the import-linter contract (so a new package cannot slip past ``lint-imports``), and the document
lists the same floors in the same order."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "torchscalpel"


def _layers(contract: str = "floors") -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (floors,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == contract]
    return [
        [m.strip().removeprefix("torchscalpel.") for m in re.split(r"[|:]", layer)]
        for layer in floors["layers"]
    ]


def _doc_rows(marker: str) -> list[list[str]]:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    block = doc.split(f"<!-- {marker}:start -->", 1)[1].split(f"<!-- {marker}:end -->", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| floor")]
    return [sorted(re.findall(r"`([a-z_]+)`", row.split("|")[2])) for row in rows]


def _top_level_modules() -> set[str]:
    names = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return names


def test_every_top_level_module_is_on_a_floor():
    declared = {name for layer in _layers() for name in layer}
    missing = _top_level_modules() - declared
    assert not missing, f"add these to a floor in pyproject's [tool.importlinter] contract: {sorted(missing)}"
    assert not declared - _top_level_modules(), "the contract names modules that no longer exist"


def test_architecture_doc_lists_the_contract_floors_in_order():
    assert _doc_rows("floors") == [sorted(layer) for layer in _layers()]


def test_architecture_doc_lists_the_fix_floors_in_order():
    """docs/ARCHITECTURE.md's "Inside fix" table lists pyproject's ``fix floors`` contract, in order."""
    assert _doc_rows("fix-floors") == [sorted(layer) for layer in _layers("fix floors")]

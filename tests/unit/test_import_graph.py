"""The import graph of ``src/torchscalpel`` (grimp, the graph import-linter builds, plus an ast walk of the
same files) keeps three rules the floors contract cannot see:

- no import cycle between the modules of a package, nor between its parts (its modules and subpackages,
  a subpackage standing for all it holds). A function-level (lazy) import counts, as it does
  for the floors: it runs when the function is called, and an import made lazy to dodge a cycle still
  ties the two modules together (that is how the ``fix/edits*`` knot hid). An import only under
  ``TYPE_CHECKING`` does not count: it never runs. A lazy import for another reason (an optional
  dependency such as libcst, torch kept out of a light import) is fine: it makes no cycle;
- no import of another module's private name: a ``_name`` belongs to the module or package that defines
  it, and only code inside that module or package may import it (``doctor/rules/_common.py`` serves the
  rule modules beside it), by ``from M import _name`` or as ``M._name`` on an imported module;
- no ``importlib.import_module`` (or ``__import__``) of torchscalpel's own modules outside the CLI's
  dispatch of its verbs (an edge the floors contract and this graph cannot see); one of a name not
  written in the call is allowed only where :data:`DYNAMIC_IMPORTS` says what it loads.

``test_the_checks_see_what_they_forbid`` plants each fault in a throwaway package and sees it found.
"""

from __future__ import annotations

import ast
import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = "torchscalpel"

KNOWN_CYCLES: dict[str, str] = {}
"""Packages whose one known import cycle is tolerated, with why; an entry that matches no cycle fails."""

DISPATCH: dict[str, str] = {
    "torchscalpel.cli.main": "the CLI's dispatch: each verb's module registers its sub-parser",
}
"""Modules allowed to import torchscalpel's own modules by name at run time."""

DYNAMIC_IMPORTS: dict[str, str] = {
    "torchscalpel.loading": "the user's MODULE:NAME (scalpel plan --model, export's factory)",
    "torchscalpel.plan.simulate": "the optimizer class a plan names (torch.optim.AdamW or the user's own)",
}
"""Modules allowed to call ``import_module`` on a name not written in the call, and what they load."""


def build_graph(package: str) -> grimp.ImportGraph:
    """The package's import graph: lazy imports in, ``TYPE_CHECKING`` imports out (as lint-imports)."""
    return grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of modules that import each other around a loop, each sorted; a cycle can only join
    modules of one top-level package, as the floors allow no import upward."""
    return strongly_connected({m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules})


def part_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of the parts of one package (its modules and subpackages, each subpackage standing for
    all it holds) that import each other around a loop: a loop the module graph can miss, as when a
    module of ``sub`` imports ``m`` and ``m`` imports another module of ``sub``."""
    found = []
    for package in sorted(graph.modules):
        parts = sorted(graph.find_children(package))
        if len(parts) < 2:
            continue
        owner = {m: part for part in parts for m in {part, *graph.find_descendants(part)}}
        edges: dict[str, set[str]] = {part: set() for part in parts}
        for module, part in owner.items():
            for imported in graph.find_modules_directly_imported_by(module):
                target = owner.get(imported)
                if target is not None and target != part:
                    edges[part].add(target)
        found += strongly_connected({k: sorted(v) for k, v in edges.items()})
    return sorted(found)


def strongly_connected(edges: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of two or more nodes (each sorted): the loops of ``edges``."""
    modules = sorted(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in modules:  # Tarjan's algorithm, iterative: the graph is deeper than Python's recursion
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(edges.get(start, [])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(edges.get(target, []))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def cycle_text(graph: grimp.ImportGraph, component: list[str]) -> str:
    """One loop through ``component``, each import with its line: what to cut first."""
    first = component[0]
    start = next(m for m in sorted(graph.find_modules_directly_imported_by(first)) if m in component)
    chain = [first, *graph.find_shortest_chain(importer=start, imported=first)]
    hops = []
    for importer, imported in itertools.pairwise(chain):
        details = graph.get_import_details(importer=importer, imported=imported)
        line = details[0]["line_number"] if details else "?"
        hops.append(f"{importer}:{line} -> {imported}")
    return f"{len(component)} modules ({', '.join(component)}); one loop: " + "; ".join(hops)


def allowed_package(component: list[str], known: dict[str, str]) -> str | None:
    """The :data:`KNOWN_CYCLES` entry that holds every module of ``component`` (None: none does)."""
    return next((p for p in known if all(m == p or m.startswith(p + ".") for m in component)), None)


@dataclass(frozen=True)
class Source:
    """One module of the package: its dotted name, its file, its parsed tree."""

    name: str
    path: Path
    tree: ast.Module

    @property
    def package(self) -> str:
        """The package its relative imports start from."""
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


@functools.cache
def sources(src: Path, package: str) -> tuple[Source, ...]:
    """Every module of ``package`` under ``src``, parsed (once per test session)."""
    out = []
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(Source(".".join(parts), path, ast.parse(path.read_text(encoding="utf-8"), str(path))))
    return tuple(out)


def _is_private(segment: str) -> bool:
    return segment.startswith("_") and not segment.startswith("__")


def private_owner(target: str) -> str | None:
    """The module or package a dotted name is private to (its part before the first ``_segment``)."""
    parts = target.split(".")
    return next((".".join(parts[:i]) for i, part in enumerate(parts) if i and _is_private(part)), None)


def _inside(importer: str, owner: str) -> bool:
    return importer == owner or importer.startswith(owner + ".")


def _resolved(source: Source, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = source.package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _dotted(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else [*head, node.attr]
    return None


def private_imports(src: Path, package: str, modules: set[str]) -> list[str]:
    """``file:line: name`` for each use of another module's private name: imported by name, or read as
    an attribute of an imported module of the package (lazy imports included)."""
    found = []
    for source in sources(src, package):
        bound: dict[str, str] = {}  # a local name -> the module of the package it is bound to
        targets: list[tuple[int, str]] = []
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == package or alias.name.startswith(package + "."):
                        targets.append((node.lineno, alias.name))
                        if alias.asname:
                            bound[alias.asname] = alias.name
                        else:
                            bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                module = _resolved(source, node)
                if module != package and not module.startswith(package + "."):
                    continue
                for alias in node.names:
                    targets.append((node.lineno, f"{module}.{alias.name}"))
                    if f"{module}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{module}.{alias.name}"
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                chain = _dotted(node.value)
                if chain and chain[0] in bound:
                    targets.append((node.lineno, ".".join([bound[chain[0]], *chain[1:], node.attr])))
        for line, target in targets:
            owner = private_owner(target)
            if owner is not None and not _inside(source.name, owner):
                found.append(f"{source.path.relative_to(src)}:{line}: {target}")
    return sorted(set(found))


def _leading_text(node: ast.expr) -> str | None:
    """The literal start of a module name as written in the call (None: nothing of it is written)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _leading_text(node.left)
    return None


def runtime_imports(src: Path, package: str, dispatch: dict[str, str], dynamic: dict[str, str]) -> list[str]:
    """``file:line: what`` for each ``import_module`` / ``__import__`` of the package's own modules
    outside ``dispatch``, and of a name not written in the call outside ``dynamic``."""
    found = []
    for source in sources(src, package):
        for node in ast.walk(source.tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if name not in ("import_module", "__import__"):
                continue
            where = f"{source.path.relative_to(src)}:{node.lineno}"
            text = _leading_text(node.args[0])
            if text is None:
                if source.name not in dynamic:
                    found.append(f"{where}: {name} of a name not written there ({ast.unparse(node.args[0])})")
            elif (text.startswith((package + ".", ".")) or text == package) and source.name not in dispatch:
                found.append(f"{where}: {name}({ast.unparse(node.args[0])})")
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return build_graph(PACKAGE)


def test_no_import_cycle_inside_a_package(graph: grimp.ImportGraph) -> None:
    cycles = import_cycles(graph)
    unknown = [cycle_text(graph, c) for c in cycles if allowed_package(c, KNOWN_CYCLES) is None]
    assert not unknown, (
        "import cycles (cut each where its jobs part; see docs/ARCHITECTURE.md):\n" + "\n".join(unknown)
    )
    matched = {allowed_package(c, KNOWN_CYCLES) for c in cycles}
    stale = sorted(set(KNOWN_CYCLES) - matched)
    assert not stale, f"KNOWN_CYCLES names packages with no cycle left; delete their entries: {stale}"


def test_no_cycle_between_the_parts_of_a_package(graph: grimp.ImportGraph) -> None:
    unknown = [", ".join(c) for c in part_cycles(graph) if allowed_package(c, KNOWN_CYCLES) is None]
    assert not unknown, "modules and subpackages of one package that import each other around a loop:\n" + (
        "\n".join(unknown)
    )


def test_no_private_name_is_imported_from_another_module(graph: grimp.ImportGraph) -> None:
    found = private_imports(SRC, PACKAGE, set(graph.modules))
    assert not found, (
        "private names used outside the module that defines them (make them public):\n" + "\n".join(found)
    )


def test_no_import_module_of_our_own_modules_outside_the_cli_dispatch() -> None:
    found = runtime_imports(SRC, PACKAGE, DISPATCH, DYNAMIC_IMPORTS)
    assert not found, (
        "run-time imports the import graph cannot see (import the module plainly):\n" + "\n".join(found)
    )


def test_the_allowances_name_real_modules(graph: grimp.ImportGraph) -> None:
    for name in [*KNOWN_CYCLES, *DISPATCH, *DYNAMIC_IMPORTS]:
        assert name in graph.modules, f"{name} is not a module of {PACKAGE}; update the allow-list"


PLANTED = {
    "__init__.py": "",
    "a.py": "from probe_pkg.c import public\n\n\ndef later():\n    from probe_pkg import b\n\n    return b\n",
    "b.py": "import probe_pkg.a\n",
    "c.py": (
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from probe_pkg import d\n\n"
        "public = 1\n_hidden = 2\n"
    ),
    "d.py": "from probe_pkg import c\nfrom probe_pkg.c import _hidden\n\nx = c._hidden + _hidden\n",
    "e.py": (
        "import importlib\n\n\ndef load(name):\n    importlib.import_module(f'probe_pkg.{name}')\n"
        "    return importlib.import_module(name)\n"
    ),
    "sub/__init__.py": "",
    "sub/_own.py": "y = 1\n",
    "sub/user.py": "from probe_pkg.sub._own import y\n",
    "outsider.py": "from probe_pkg.sub import _own\n",
    "sub2/__init__.py": "",
    "sub2/x.py": "import probe_pkg.f\n",
    "sub2/y.py": "z = 1\n",
    "f.py": "from probe_pkg.sub2 import y\n",
}


def test_the_checks_see_what_they_forbid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A throwaway package with one of each fault: a cycle through a lazy import (a <-> b), a subpackage
    and a module that need each other with no loop of modules (sub2 <-> f), a back
    import only under TYPE_CHECKING (c -> d: no cycle), a private name taken by name and as an attribute
    (d), a run-time import of the package's own module and one of a name not written (e), a private
    module used beside it (sub/user: fine) and from outside its package (outsider)."""
    for rel, text in PLANTED.items():
        path = tmp_path / "probe_pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    planted = build_graph("probe_pkg")

    cycles = import_cycles(planted)
    assert cycles == [["probe_pkg.a", "probe_pkg.b"]]
    assert "probe_pkg.a:5 -> probe_pkg.b" in cycle_text(planted, cycles[0])
    assert allowed_package(cycles[0], {"probe_pkg.sub": "not this one"}) is None
    assert allowed_package(cycles[0], {"probe_pkg": "this one"}) == "probe_pkg"
    # sub2.x -> f -> sub2.y is no loop of modules, but sub2 and f need each other
    assert part_cycles(planted) == [["probe_pkg.a", "probe_pkg.b"], ["probe_pkg.f", "probe_pkg.sub2"]]

    assert private_imports(tmp_path, "probe_pkg", set(planted.modules)) == [
        "probe_pkg/d.py:2: probe_pkg.c._hidden",
        "probe_pkg/d.py:4: probe_pkg.c._hidden",
        "probe_pkg/outsider.py:1: probe_pkg.sub._own",
    ]

    assert runtime_imports(tmp_path, "probe_pkg", {}, {}) == [
        "probe_pkg/e.py:5: import_module(f'probe_pkg.{name}')",
        "probe_pkg/e.py:6: import_module of a name not written there (name)",
    ]
    assert (
        runtime_imports(tmp_path, "probe_pkg", {"probe_pkg.e": "dispatch"}, {"probe_pkg.e": "user's"}) == []
    )

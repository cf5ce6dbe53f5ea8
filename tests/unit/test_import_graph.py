"""The package's import graph: every module imports by its dotted name, and no subpackage has an import
cycle among its own modules (lazy, function-level imports count), but those of :data:`CYCLES_LEFT`."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

import grimp

import torchscalpel

MODULES = sorted(m.name for m in pkgutil.walk_packages(torchscalpel.__path__, "torchscalpel."))
"""Every module and subpackage under src/torchscalpel (the bundled example scripts too: they run only as ``__main__``)."""

API_FUNCTIONS = frozenset(
    {"torchscalpel.doctor", "torchscalpel.memory", "torchscalpel.plan", "torchscalpel.compare"}
)
"""Subpackages whose name on ``torchscalpel`` is the in-process function of the same name (the public API);
the function lends them its attributes, so the dotted names below them still resolve."""

CYCLES_LEFT = frozenset({"torchscalpel.fix", "torchscalpel.memory", "torchscalpel.runtime"})
"""Subpackages whose own modules still import one another in a cycle, to be cut along their seams (issue 38);
every other subpackage has none (the doctor's rules sit below the catalogue that collects them)."""


def _by_attribute(name: str) -> object:
    """What ``import NAME as m`` binds: each dotted part read as an attribute of the one before."""
    return functools.reduce(getattr, name.split(".")[1:], torchscalpel)


def test_every_module_imports_by_its_dotted_name() -> None:
    assert len(MODULES) > 200 and "torchscalpel.doctor.api" in MODULES  # the walk found the package
    failures: list[str] = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
            found = _by_attribute(name)
        except Exception as exc:  # every failure is listed, not only the first
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if name in API_FUNCTIONS:
            if not (inspect.isfunction(found) and vars(found) is vars(module)):
                failures.append(f"{name}: the API function does not lend the package its namespace")
        elif found is not module:
            failures.append(f"{name}: the dotted name reaches {found!r}, not the module")
    assert failures == []


def test_the_statement_form_reaches_a_module_below_an_api_function() -> None:
    import torchscalpel.doctor.api as api  # the attribute chain passes through the function torchscalpel.doctor
    import torchscalpel.memory.analysis as analysis

    assert api.__name__ == "torchscalpel.doctor.api" and analysis.__name__ == "torchscalpel.memory.analysis"
    assert torchscalpel.doctor.api is api and inspect.isfunction(torchscalpel.doctor)


def import_cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The import cycles among ``package``'s own modules: each strongly connected set of two or more
    modules (or a module that imports itself), sorted."""
    inside = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    members = set(inside)
    edges = {m: sorted(d for d in graph.find_modules_directly_imported_by(m) if d in members) for m in inside}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in inside:  # Tarjan's algorithm, iterative (a deep package must not hit the recursion limit)
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1 or node in edges[node]:
                    cycles.append(sorted(group))
    return sorted(cycles)


def test_no_import_cycle_inside_a_subpackage() -> None:
    graph = grimp.build_graph("torchscalpel", cache_dir=None)  # imports inside functions are edges too
    packages = sorted(m for m in graph.modules if m != "torchscalpel" and graph.find_children(m))
    assert {"torchscalpel.doctor", "torchscalpel.doctor.rules", "torchscalpel.tune"} <= set(packages)
    found = {
        p: cycles
        for p in packages
        if not any(p == left or p.startswith(left + ".") for left in CYCLES_LEFT)
        and (cycles := import_cycles(graph, p))
    }
    assert found == {}
    for left in sorted(CYCLES_LEFT):  # the list only shrinks: a package cut free leaves it
        assert import_cycles(graph, left), f"{left} has no import cycle left: remove it from CYCLES_LEFT"


def test_the_cycle_check_sees_a_planted_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.catalogue", "pkg.rule", "pkg.rules.a", "pkg.rules.b", "pkg.api", "other"):
        graph.add_module(name)
    for importer, imported in (
        ("pkg.catalogue", "pkg.rules.a"),
        ("pkg.rules.a", "pkg.rule"),
        ("pkg.rules.a", "pkg.rules.b"),
        ("pkg.rules.b", "pkg.catalogue"),  # a rule reaching back up to the catalogue
        ("pkg.api", "pkg.catalogue"),
        ("pkg.rule", "other"),
        ("other", "pkg.rule"),  # a cycle through a module outside the package is not the package's
    ):
        graph.add_import(importer=importer, imported=imported)
    assert import_cycles(graph, "pkg") == [["pkg.catalogue", "pkg.rules.a", "pkg.rules.b"]]
    graph.remove_import(importer="pkg.rules.b", imported="pkg.catalogue")
    assert import_cycles(graph, "pkg") == []
    graph.add_import(importer="pkg.api", imported="pkg.api")
    assert import_cycles(graph, "pkg") == [["pkg.api"]]

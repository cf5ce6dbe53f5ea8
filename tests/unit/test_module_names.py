"""Every module imports by its dotted name, including those below a subpackage whose name on ``torchscalpel`` is
an API function (cycles and private imports: tests/unit/test_import_graph.py)."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

import torchscalpel

MODULES = sorted(m.name for m in pkgutil.walk_packages(torchscalpel.__path__, "torchscalpel."))
"""Every module and subpackage under src/torchscalpel (the bundled example scripts too: they run only as ``__main__``)."""

API_FUNCTIONS = frozenset(
    {
        "torchscalpel.doctor",
        "torchscalpel.memory",
        "torchscalpel.plan",
        "torchscalpel.compare",
        "torchscalpel.tune",
        "torchscalpel.fix",
    }
)
"""Subpackages whose name on ``torchscalpel`` is the in-process function of the same name (the public API);
the function lends them its attributes, so the dotted names below them still resolve."""


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

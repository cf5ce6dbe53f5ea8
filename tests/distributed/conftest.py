"""The distributed tests' folder: process groups of several ranks and launches (the one-rank group,
``single_rank``, is a fixture of ``tests/conftest.py``: it starts no process and serves tests/unit too).

Every test in this folder carries the ``dist`` marker, so ``-m "not dist"`` (the suite without its process
groups) leaves the whole folder out and ``-m dist`` selects it, whether or not a module declares the marker
itself."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this folder ``dist`` (a conftest hook sees the whole session's items)."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.dist)

"""Fixtures for torchscalpel.distributed tests: a one-rank process group, and 2-rank launches.

Every test in this folder carries the ``dist`` marker, so ``-m "not dist"`` (the suite without its process
groups) leaves the whole folder out and ``-m dist`` selects it, whether or not a module declares the marker
itself."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from torchscalpel import distributed as sd

DIST_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE",
)

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this folder ``dist`` (a conftest hook sees the whole session's items)."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.dist)


@pytest.fixture()
def single_rank(monkeypatch):
    """A one-rank gloo group on an in-memory store (what a plain ``python train.py`` gets)."""
    for name in DIST_ENV:
        monkeypatch.delenv(name, raising=False)
    previous = signal.getsignal(signal.SIGTERM)
    ctx = sd.setup(seed=0)
    yield ctx
    sd.teardown()
    signal.signal(signal.SIGTERM, previous)

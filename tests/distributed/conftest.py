"""Fixtures for torchscalpel.distributed tests: a one-rank process group, and 2-rank launches."""

from __future__ import annotations

import signal

import pytest

from torchscalpel import distributed as sd

DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_USE_AGENT_STORE")


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

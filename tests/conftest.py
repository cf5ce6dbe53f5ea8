"""Shared test fixtures: repository paths, the shared data folder, process-group cleanup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
FIXTURES = REPO / "tests" / "fixtures"
# CI lays shared/ beside the clone; SCALPEL_SHARED_DIR overrides for other layouts.
SHARED = Path(os.environ.get("SCALPEL_SHARED_DIR", REPO.parent / "shared"))
TRACES = SHARED / "data" / "traces"


@pytest.fixture(autouse=True)
def _destroy_process_group():
    """No test leaks a process group into the next one."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture()
def traces_dir() -> Path:
    """The recorded profiler traces from ../shared/data/traces (fails loudly if missing)."""
    assert TRACES.is_dir(), f"shared trace data not found at {TRACES}; set SCALPEL_SHARED_DIR"
    return TRACES

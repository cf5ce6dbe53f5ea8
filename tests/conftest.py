"""Shared test fixtures: repository paths, the shared data folder, process-group cleanup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import COMMITTED_TRACES

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
FIXTURES = REPO / "tests" / "fixtures"
# Optional: CI lays shared/ beside the clone (SCALPEL_SHARED_DIR overrides); tests that need it skip without it.
SHARED = Path(os.environ.get("SCALPEL_SHARED_DIR", REPO.parent / "shared"))
TRACES = SHARED / "data" / "traces"
"""HolisticTraceAnalysis's recorded traces (the HTA agreement tests compare against tests/data/hta_*.json)."""


@pytest.fixture(autouse=True)
def _destroy_process_group():
    """No test leaks a process group into the next one."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture()
def traces_dir() -> Path:
    """The recorded HTA traces from ../shared/data/traces; the test skips (saying where it looked) without them."""
    if not TRACES.is_dir():
        pytest.skip(f"shared HTA traces not found at {TRACES} (set SCALPEL_SHARED_DIR); "
                    f"the committed traces in {COMMITTED_TRACES.relative_to(REPO)} cover the same code")
    return TRACES


@pytest.fixture(params=["committed", "shared"])
def trace_set(request: pytest.FixtureRequest) -> Path:
    """For tests that only need a trace of a given layout: the committed traces, then the shared ones."""
    return COMMITTED_TRACES if request.param == "committed" else request.getfixturevalue("traces_dir")

"""Shared test fixtures: repository paths, the shared data folder, process-group cleanup, one inductor cache,
and a per-folder time summary at the end of a run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import COMMITTED_TRACES

# The record check lives in record_guard.py, a module of its own: `from conftest import ...` in a test can
# resolve to tests/distributed/conftest.py when the whole suite is collected.
from record_guard import RECORD_CHECK_ENV, record_violations

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
FIXTURES = REPO / "tests" / "fixtures"
# Optional: CI lays shared/ beside the clone (SCALPEL_SHARED_DIR overrides); tests that need it skip without it.
SHARED = Path(os.environ.get("SCALPEL_SHARED_DIR", REPO.parent / "shared"))
TRACES = SHARED / "data" / "traces"
"""HolisticTraceAnalysis's recorded traces (the HTA agreement tests compare against tests/data/hta_*.json)."""

# One inductor cache for the whole run (DESIGN.md, Testing): a cold compile costs 15-25 s on 2 cores, a warm one ~2 s.
# `make test` exports this folder; a plain `pytest` gets the same one, for in-process compiles and for every child
# process a test starts (helpers.cli_env and tune's trials copy os.environ).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".cache" / "inductor"))

# pytest-xdist starts its workers with COLUMNS=80 and LINES=24. scalpel's output wraps at COLUMNS on a pipe (an
# 80-column pane reading a log), so every child a test starts would print as if to an 80-column terminal, unlike
# a plain `pytest` run: the tests that read output lines whole expect the pipe's default.
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("COLUMNS") == "80":
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "broken_record(reason): the test writes an inconsistent or unreadable "
        "run.json on purpose; the record-invariant check skips it",
    )


@pytest.fixture(autouse=True)
def _record_invariants(request: pytest.FixtureRequest):
    """After each test, every run.json under its tmp_path (the runs it wrote, --out folders included) must keep
    the record invariants (:func:`torchscalpel.record_check.check_invariants`): no stage writes an inconsistent record
    without a test failing."""
    mode = os.environ.get(RECORD_CHECK_ENV, "strict")
    if (
        mode == "off"
        or "tmp_path" not in request.fixturenames
        or request.node.get_closest_marker("broken_record")
    ):
        yield
        return
    root: Path = request.getfixturevalue("tmp_path")
    yield
    import warnings

    failures, known = record_violations(root)
    if known:
        warnings.warn("record invariants (known defects): " + "; ".join(known), stacklevel=1)
    if failures:
        message = "record invariants broken:\n  " + "\n  ".join(failures)
        if mode == "warn":
            warnings.warn(message, stacklevel=1)
        else:
            pytest.fail(message, pytrace=False)


_DIST_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE",
)


@pytest.fixture()
def single_rank(monkeypatch):
    """A one-rank gloo group on an in-memory store (what a plain ``python train.py`` gets): no process, no port,
    so tests/unit may use it."""
    import signal

    from torchscalpel import distributed as sd

    for name in _DIST_ENV:
        monkeypatch.delenv(name, raising=False)
    previous = signal.getsignal(signal.SIGTERM)
    ctx = sd.setup(seed=0)
    yield ctx
    sd.teardown()
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture(autouse=True)
def _destroy_process_group():
    """No test leaks a process group into the next one."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _own_batch_history(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test keeps its own per-script launch history (rankrules.history_path, in the user's cache otherwise):
    launches of one fixture script by two tests would otherwise judge each other's world sizes."""
    monkeypatch.setenv("TORCHSCALPEL_HISTORY_DIR", str(tmp_path_factory.mktemp("batch-history")))


@pytest.fixture()
def traces_dir() -> Path:
    """The recorded HTA traces from ../shared/data/traces; the test skips (saying where it looked) without them."""
    if not TRACES.is_dir():
        pytest.skip(
            f"shared HTA traces not found at {TRACES} (set SCALPEL_SHARED_DIR); "
            f"the committed traces in {COMMITTED_TRACES.relative_to(REPO)} cover the same code"
        )
    return TRACES


@pytest.fixture(params=["committed", "shared"])
def trace_set(request: pytest.FixtureRequest) -> Path:
    """For tests that only need a trace of a given layout: the committed traces, then the shared ones."""
    return COMMITTED_TRACES if request.param == "committed" else request.getfixturevalue("traces_dir")


_SECONDS_BY_FOLDER: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each test's setup, call and teardown time to its folder (tests/unit, tests/integration, ...)."""
    parts = report.nodeid.split("/")
    folder = "/".join(parts[:2]) if len(parts) > 2 else parts[0].split("::")[0]
    _SECONDS_BY_FOLDER[folder] = _SECONDS_BY_FOLDER.get(folder, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    """Time spent per test folder, so that whoever runs CI sees which part of the suite costs what."""
    if not _SECONDS_BY_FOLDER:
        return
    terminalreporter.section("time per test folder")
    for folder, seconds in sorted(_SECONDS_BY_FOLDER.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {folder}")

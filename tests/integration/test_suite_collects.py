"""Every folder under tests/ that holds test modules is collected, and its markers match the folder.

pytest's default ``norecursedirs`` skips folders named ``dist`` or ``build``; 150 distributed tests once
lived in ``tests/dist`` and never ran. These tests ask pytest itself what it collects: nothing silently
skipped, every test under tests/distributed marked ``dist``, none under tests/unit marked ``dist``, ``slow``
or ``browser`` (``make test-fast`` runs tests/unit whole), and tests/unit's no-process guard in force.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def _folders_with_test_modules() -> set[Path]:
    skip = {"fixtures", "data", "__pycache__"}
    return {p.parent for p in TESTS.rglob("test_*.py") if not skip & set(p.relative_to(TESTS).parts)}


def test_every_test_folder_collects_tests() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected: dict[Path, int] = {}
    for line in done.stdout.splitlines():
        if "::" in line:
            folder = (REPO / line.split("::", 1)[0]).parent
            collected[folder] = collected.get(folder, 0) + 1
    folders = _folders_with_test_modules()
    assert folders, "no test modules found under tests/"
    empty = sorted(str(f.relative_to(REPO)) for f in folders if not collected.get(f))
    assert not empty, f"folders holding test_*.py from which pytest collected nothing: {empty}"
    # 93 since the tests that start no process moved to tests/unit (67 of 160)
    assert collected.get(TESTS / "distributed", 0) > 60, "the distributed tests are not collected"


def test_every_distributed_test_carries_the_dist_marker() -> None:
    """``-m "not dist"`` (the suite without its process groups) must leave out every test under tests/distributed."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not dist",
            "tests/distributed",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    unmarked = [line for line in done.stdout.splitlines() if "::" in line]
    assert not unmarked, f"{len(unmarked)} tests under tests/distributed lack the dist marker: {unmarked[:5]}"
    assert "deselected" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_no_unit_test_is_marked_dist_slow_or_browser() -> None:
    """A test that needs ranks, minutes or Chromium lives in tests/distributed or tests/integration:
    ``make test-fast`` runs tests/unit with no marker filter."""
    marked = _collect("-m", "dist or slow or browser", "tests/unit")
    found = [line for line in marked.stdout.splitlines() if "::" in line]
    assert not found, f"{len(found)} tests under tests/unit carry dist, slow or browser: {found[:5]}"
    everything = _collect("tests/unit")
    assert everything.returncode == 0, everything.stdout[-2000:] + everything.stderr[-2000:]
    assert sum("::" in line for line in everything.stdout.splitlines()) > 1000, "tests/unit is not collected"


def test_the_unit_guard_against_processes_is_in_force() -> None:
    """tests/unit/conftest.py refuses every way to start a process; its own tests (which start a harmless
    process when the guard is gone, and then fail) must be there and pass."""
    guard = REPO / "tests" / "unit" / "test_no_process_guard.py"
    assert guard.is_file(), (
        f"{guard.relative_to(REPO)} is gone: nothing checks that tests/unit starts no process"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(guard.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) >= 7 and "skipped" not in done.stdout, done.stdout[-2000:]

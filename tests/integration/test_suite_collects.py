"""Every folder under tests/ that holds test modules is collected: none is silently skipped.

pytest's default ``norecursedirs`` skips folders named ``dist`` or ``build``; 150 distributed tests once
lived in ``tests/dist`` and never ran. This test asks pytest itself what it collects and fails for any
folder holding ``test_*.py`` from which nothing was collected.
"""

from __future__ import annotations

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
    assert collected.get(TESTS / "distributed", 0) > 100, "the distributed tests are not collected"


def test_every_distributed_test_carries_the_dist_marker() -> None:
    """``make test-fast`` selects with ``-m "not dist"``: no test under tests/distributed may slip into it."""
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

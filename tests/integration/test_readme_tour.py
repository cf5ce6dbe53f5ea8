"""README.md's tour runs as written (issue 42): every command block, in order, in a fresh copy of the checkout,
each shown output checked against what ran (tests/readme_tour.py has the README's conventions).

A newcomer's first hour is this file: a command that fails, a file the tour never makes, or a shown line the
command no longer prints is a failure here, listed with the command's own output. ``python
tests/readme_tour.py`` runs the same tour by hand and prints each command's time (to refresh the README's
figures from a real run).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from readme_tour import REPO, parse, report_text, run_tour

README = REPO / "README.md"


def test_every_block_that_is_left_out_says_why_and_names_the_test_that_runs_it() -> None:
    blocks = parse(README.read_text())
    assert sum(1 for b in blocks if b.skip is None) >= 20, "the tour runs most of the README"
    for block in blocks:
        if block.skip is None:
            continue
        named = re.findall(r"tests/[\w/]+\.py", block.skip)
        assert named, f"README line {block.line}: 'not run' names no test that covers it: {block.skip!r}"
        for path in named:
            assert (REPO / path).is_file(), f"README line {block.line}: {path} does not exist"


def test_the_readme_names_no_temporary_folder() -> None:
    text = README.read_text()
    assert not re.search(r"(?<![\w.])/tmp/", text), "a path in the system's temporary folder: use runs/"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the tour copies the files git tracks")
    ran = run_tour(README, tmp_path)
    bad = [r for r in ran if r.problems]
    assert ran, "the README has no command to run"
    assert not bad, report_text(bad)

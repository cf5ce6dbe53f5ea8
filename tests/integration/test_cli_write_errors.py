"""``scalpel profile --json /dev/full`` as a user runs it (issue 30, item 10): the measured run is kept,
its summary shown, and the failed copy is one sentence with exit 2, not an OSError traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO, run_cli

SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "epoch_loop.py"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_profile_json_to_a_full_device(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(
        "profile", "--out", str(out), "--warmup", "0", "--steps", "2", "--profile-steps", "0",
        "--json", "/dev/full", str(SCRIPT), timeout=240,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert (
        last
        == "scalpel: error: Could not write --json /dev/full: No space left on device; choose another path."
    )
    assert len(json.loads((out / "run.json").read_text())["steps"]) == 2  # what was measured is kept
    assert f"run folder: {out}" in proc.stderr

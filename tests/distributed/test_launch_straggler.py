"""scalpel launch --profile names a real straggler, with both figures (the rule: trace.ranks.straggler_verdict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO, run_ranks

pytestmark = pytest.mark.dist
SCRIPT = REPO / "tests" / "fixtures" / "distributed" / "straggler.py"


@pytest.mark.slow
def test_a_rank_sleeping_40_ms_per_step_is_named_with_both_figures(tmp_path: Path) -> None:
    out = tmp_path / "prof"
    proc = run_ranks(
        "launch",
        "--nproc",
        "2",
        "--profile",
        "--steps",
        "8",
        "--out",
        str(out),
        "--",
        str(SCRIPT),
        cwd=tmp_path,
        timeout=280,
        expect=[out / "launch.json"],
    )
    assert (out / "launch.json").exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    merged = json.loads((out / "launch.json").read_text())
    verdict = merged["straggler_verdict"]
    assert merged["straggler"]["rank"] == 1, verdict["sentence"]
    assert verdict["what"] == "per profiled step outside collectives"
    # rank 0 waits for rank 1 in gloo's all-reduce: it shows as rank 0's collective time, not as work
    rows = {row["rank"]: row for row in merged["ranks"]}
    assert rows[0]["collective_ms"] > rows[1]["collective_ms"]
    assert (
        verdict["gap_ms"] > verdict["needed_ms"] and verdict["gap_ms"] > 20.0
    )  # 40 ms slept, less the noise
    assert "straggler: rank 1: " in proc.stdout and "against rank 0's" in proc.stdout

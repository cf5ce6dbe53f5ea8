"""scalpel launch --profile on 2 gloo ranks: a DDP step that waits on its all-reduce is called communication
bound, the same step after the split shrank its per-rank batch is called that, and a compute-heavy twin gets
neither verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_ranks
from torchscalpel.distributed.rankrules import history_path

pytestmark = [pytest.mark.dist, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "distributed" / "split_batch.py"


def _launch(tmp_path: Path, name: str, *script_args: str) -> dict:
    out = tmp_path / name
    proc = run_ranks(
        "launch",
        "--nproc",
        "2",
        "--profile",
        "--steps",
        "6",
        "--out",
        str(out),
        "--",
        str(SCRIPT),
        *script_args,
        cwd=tmp_path,
        expect=[out / "launch.json"],
        timeout=280,
    )
    assert (out / "launch.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    merged = json.loads((out / "launch.json").read_text())
    merged["stdout"] = proc.stdout
    return merged


def test_communication_bound_and_split_batch_fire_and_the_compute_heavy_twin_does_not(tmp_path: Path) -> None:
    wide = _launch(tmp_path, "wide", "--model", "wide", "--batch", "8")
    rules = [v["rule"] for v in wide["verdicts"]]
    assert rules == ["communication-bound"], (rules, wide["ranks"])
    assert "[warning] communication-bound: the step is communication bound" in wide["stdout"]
    # an earlier launch of this script on one rank with the whole global batch of 16 (its history line)
    history = history_path(str(SCRIPT))
    rows = json.loads(history.read_text())
    history.write_text(json.dumps([*rows, {**rows[-1], "world": 1, "batch": 16}]))
    split = _launch(tmp_path, "split", "--model", "wide", "--batch", "8")
    (verdict,) = split["verdicts"]
    assert verdict["rule"] == "per-rank-batch-split"
    assert verdict["message"].startswith(
        "the split shrank the per-rank batch from 16 to 8: global batch 16 kept"
    )
    assert "per-rank-batch-split" in (tmp_path / "split" / "launch.html").read_text()
    deep = _launch(tmp_path, "deep", "--model", "deep", "--batch", "512")
    assert deep["verdicts"] == [], deep["ranks"]

"""scalpel launch --plan on 2 gloo ranks: the plan runs first, warns when nothing fits, and the launch goes on."""

from __future__ import annotations

import json

import pytest

from helpers import REPO, run_cli, run_ranks

pytestmark = pytest.mark.dist
EXAMPLE = REPO / "examples" / "ddp_fsdp_transformer.py"


@pytest.mark.slow
def test_plan_warns_before_a_run_that_will_not_fit_and_the_run_still_happens(tmp_path):
    out = tmp_path / "run"
    logs = tmp_path / "logs"
    proc = run_ranks(
        "launch",
        "--nproc",
        "2",
        "--plan",
        "--plan-device-memory",
        "300MiB",
        "--out",
        str(out),
        "--",
        str(EXAMPLE),
        "--steps",
        "2",
        "--workers",
        "0",
        "--strategy",
        "ddp",
        "--ckpt",
        str(tmp_path / "ckpt"),
        "--log",
        str(logs),
        cwd=tmp_path,
        expect=[logs / "losses-rank1.jsonl"],
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "2 rank(s), batch 8" in text and "ddp" in text and "does NOT fit" in text
    assert "WARNING: this run will not fit on any strategy" in text
    plan = json.loads((out / "plan" / "plan.json").read_text())
    assert plan["world_size"] == 2 and plan["batch_size"] == 8
    assert {r["strategy"] for r in plan["rows"]} >= {"ddp", "fsdp-full"}
    # the ranks ran after the plan
    assert (logs / "losses-rank0.jsonl").exists() and (logs / "losses-rank1.jsonl").exists()
    assert text.index("WARNING: this run will not fit") < text.index("starting at step 0")


def test_plan_device_memory_without_plan_is_refused_before_anything_starts(tmp_path):
    proc = run_cli(
        "launch",
        "--nproc",
        "2",
        "--plan-device-memory",
        "8GiB",
        "--",
        str(EXAMPLE),
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--plan-device-memory only applies with --plan." in proc.stderr + proc.stdout

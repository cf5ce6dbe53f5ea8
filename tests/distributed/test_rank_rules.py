"""Checks that need every rank (launch --doctor): planted and clean fixtures through 2 gloo ranks, and the
judgments on recorded facts (device_ids cannot be planted on CPU: DDP refuses device_ids for CPU modules)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO, run_ranks
from torchscalpel.distributed.rankrules import (
    SLUGS,
    device_id_findings,
    loss_scale_findings,
    no_sync_findings,
    rng_findings,
    sampler_findings,
)

FIXTURES = REPO / "tests" / "fixtures" / "distributed"


def _facts(rank: int, **over) -> dict:
    base = {"rank": rank, "world": 2, "local_rank": rank, "samplers": [], "ddp": [], "steps": [], "rng": None}
    return {**base, **over}


def test_device_ids_must_be_the_local_rank():
    ddp = {"device_ids": [0], "grad_bytes": 4, "site": "t.py:9"}
    bad = {0: _facts(0, ddp=[ddp]), 1: _facts(1, ddp=[ddp])}
    found = device_id_findings(bad)
    assert found[0]["rule"] == "ddp-device-ids-not-local-rank" and found[0]["ranks"] == [1]
    assert found[0]["message"] == "DDP(device_ids=[0]) on rank 1 whose LOCAL_RANK is 1: ranks share a device"
    good = {r: _facts(r, ddp=[{**ddp, "device_ids": [r]}]) for r in (0, 1)}
    assert (
        device_id_findings(good) == []
        and device_id_findings({0: _facts(0, ddp=[{**ddp, "device_ids": None}])}) == []
    )


def test_judgments_on_recorded_facts():
    sampler = {"num_replicas": 1, "rank": 0, "world": 2, "actual_rank": 0, "site": "t.py:3"}
    assert "part of" not in sampler_findings({0: _facts(0, samplers=[sampler])})[0]["message"]
    many = {**sampler, "num_replicas": 4}
    assert "part of the data is never read" in sampler_findings({0: _facts(0, samplers=[many])})[0]["message"]
    ddp = [{"device_ids": None, "grad_bytes": 1000, "site": "t.py:5"}]
    accum = {0: _facts(0, ddp=ddp, steps=[[4, 0]] * 5)}
    assert no_sync_findings(accum)[0]["evidence"][-1].startswith(
        "3 extra all-reduces of 1000 B of gradients per step: 2.9 KiB sent for nothing per step per rank"
    )
    assert no_sync_findings({0: _facts(0, ddp=ddp, steps=[[1, 3]] * 5)}) == []
    assert no_sync_findings({0: _facts(0, ddp=[], steps=[[4, 0]] * 5)}) == []  # no DDP: nothing all-reduces
    same = {r: _facts(r, rng={"torch": 1, "python": 2}) for r in (0, 1)}
    assert rng_findings(same)[0]["ranks"] == [0, 1]
    assert rng_findings({0: _facts(0, rng={"torch": 1}), 1: _facts(1, rng={"torch": 2})}) == []
    assert rng_findings({0: _facts(0, rng={"torch": 1}), 1: _facts(1)}) == []  # a rank that never got there
    assert rng_findings({r: _facts(r, rng={"python": 2}) for r in (0, 1)}) == []  # torch not drawn per step


def _doctor(tmp_path: Path, fixture: str, output: list[str] | None = None) -> list[dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "launch"
    proc = run_ranks(
        "launch",
        "--nproc",
        "2",
        "--doctor",
        "--steps",
        "6",
        "--out",
        str(out),
        "--",
        str(FIXTURES / fixture),
        cwd=tmp_path,
        expect=[out / "launch.json"],
        timeout=280,
    )
    assert (out / "launch.json").exists(), proc.stderr[-3000:]
    if output is not None:
        output.append(proc.stdout)
    return json.loads((out / "launch.json").read_text())["findings"]


@pytest.mark.dist
def test_planted_pitfalls_are_found_across_ranks(tmp_path):
    output: list[str] = []
    every = _doctor(tmp_path, "rules_bad.py", output)
    # the launcher's cross-rank findings; a rank's own doctor raising the same rule is not listed again
    findings = {f["rule"]: f for f in every if f["rule"] in SLUGS and f.get("source") == "launch"}
    repeated = [f["rule"] for f in every if f["rule"] in findings and f.get("source") != "launch"]
    assert repeated == [], every
    # the terminal says one true thing: each rank a one-line summary, then the launcher's findings once,
    # across ranks first; no rank's "No findings." above them
    stdout = output[0]
    assert "No findings" not in stdout, stdout[-3000:]
    assert stdout.count("finding(s) in ") == 2 and stdout.count("[bold]") == 0
    assert (
        stdout.index("across ranks (the launcher compared the 2 ranks):")
        < stdout.index("distributed-sampler-wrong-world")
        < stdout.index("per rank")
    )
    assert set(findings) == {
        "distributed-sampler-wrong-world",
        "ddp-accumulation-without-no-sync",
        "identical-random-streams",
    }
    assert findings["distributed-sampler-wrong-world"]["ranks"] == [1]
    assert findings["distributed-sampler-wrong-world"]["evidence"][0].endswith("rules_bad.py:16")
    assert findings["ddp-accumulation-without-no-sync"]["message"].startswith(
        "DDP all-reduces the gradients on every micro-batch: 4 synchronising backward passes"
    )
    assert findings["identical-random-streams"]["ranks"] == [0, 1]
    assert stdout.count("ddp-accumulation-without-no-sync") == 1, stdout[-3000:]


@pytest.mark.dist
def test_the_clean_version_raises_none_of_them(tmp_path):
    assert [f["rule"] for f in _doctor(tmp_path, "rules_clean.py") if f["rule"] in SLUGS] == []


@pytest.mark.dist
def test_one_batch_epochs_on_alike_seeded_ranks_are_not_a_random_stream(tmp_path):
    """Issue 40: every rank seeded alike, no randomness in the step, one batch per rank per epoch: the only
    draw between steps is the DataLoader's own per-epoch base seed, which no step uses."""
    found = [f["rule"] for f in _doctor(tmp_path, "rng_clean_one_batch_epochs.py")]
    assert "identical-random-streams" not in found, found


def test_static_device_ids_rule_positive_and_clean():
    from torchscalpel.doctor.static_scan import analyze_source

    bad = FIXTURES / "ddp_device_ids_bad.py"
    found = [
        f for f in analyze_source(bad.read_text(), str(bad)) if f.rule == "ddp-device-ids-not-local-rank"
    ]
    assert [(f.location.line, f.message) for f in found] == [
        (10, "DDP(device_ids=[0]) is not this rank's LOCAL_RANK: every rank uses the same GPU."),
        (
            11,
            "DDP(device_ids=[dist.get_rank()]) is not this rank's LOCAL_RANK: the global rank runs past the GPUs "
            "of a node after the first.",
        ),
    ]
    clean = FIXTURES / "ddp_device_ids_clean.py"
    assert [
        f for f in analyze_source(clean.read_text(), str(clean)) if f.rule == "ddp-device-ids-not-local-rank"
    ] == []


def test_undivided_accumulated_loss_judgment():
    ddp = [{"device_ids": None, "grad_bytes": 4, "site": "t.py:5"}]
    raw = [[4, 0, False, "MseLossBackward0"]] * 5
    found = loss_scale_findings({0: _facts(0, ddp=ddp, backward=raw, lr=0.01)})
    assert found[0]["rule"] == "accumulated-loss-not-divided" and found[0]["message"].startswith(
        "the loss is not divided by the accumulation steps: 4 backward passes per optimizer step"
    )
    assert found[0]["evidence"][-1].endswith("the optimizer's lr is 0.01")
    assert loss_scale_findings({0: _facts(0, ddp=ddp, backward=[[4, 4, False, "DivBackward0"]] * 5)}) == []
    assert loss_scale_findings({0: _facts(0, ddp=ddp, backward=[[1, 0, False, "MeanBackward0"]] * 5)}) == []
    assert (
        loss_scale_findings({0: _facts(0, ddp=ddp, backward=[[20, 0, True, "MeanBackward0"]] * 5)}) == []
    )  # LBFGS
    assert loss_scale_findings({0: _facts(0, backward=raw)}) == []  # no DDP


def test_scaled_root_sees_division_mul_and_sums_of_divided_terms():
    import torch

    from torchscalpel.runtime.rankfacts import scaled_root

    w = torch.ones(3, requires_grad=True)
    assert scaled_root((w.sum() / 4).grad_fn) and scaled_root((w.sum() * 0.25).grad_fn)
    assert scaled_root((w.sum() / 4 + w.mean() / 4).grad_fn)
    assert not scaled_root(w.pow(2).mean().grad_fn) and not scaled_root((w.sum() + w.mean() / 4).grad_fn)


@pytest.mark.dist
def test_undivided_accumulated_loss_planted_and_clean(tmp_path):
    bad = [
        f
        for f in _doctor(tmp_path / "bad", "accum_undivided_bad.py")
        if f["rule"] == "accumulated-loss-not-divided"
    ]
    assert len(bad) == 1 and bad[0]["ranks"] == [0, 1], bad
    assert "graph root MseLossBackward0" in bad[0]["evidence"][0]
    clean = _doctor(tmp_path / "clean", "accum_undivided_clean.py")
    assert [f["rule"] for f in clean if f["rule"] in SLUGS] == []


def test_batch_history_judgment(tmp_path):
    from torchscalpel.distributed.rankrules import batch_entry, batch_findings, history_path, rank_findings

    facts = {r: _facts(r, world=4, batch=8, lr=0.05, script="/s/train.py") for r in range(4)}
    entry = batch_entry(facts)
    info = batch_findings(entry, [])
    assert [f["rule"] for f in info] == ["global-batch"]
    assert info[0]["severity"] == "info" and info[0]["message"] == (
        "global batch 32 = per-rank batch 8 x 4 ranks, optimizer lr 0.05"
    )
    old = {**entry, "world": 2}
    warn = batch_findings(entry, [old])
    assert warn[0]["rule"] == "batch-not-rescaled-for-world" and "from 16 to 32" in warn[0]["message"]
    assert "per-rank batch to 4" in warn[0]["fix"]
    assert [f["rule"] for f in batch_findings(entry, [{**old, "lr": 0.025}])] == [
        "global-batch"
    ]  # lr followed
    assert [f["rule"] for f in batch_findings(entry, [{**old, "batch": 16}])] == [
        "global-batch"
    ]  # batch rescaled
    assert [f["rule"] for f in batch_findings(entry, [{**old, "script": "/s/other.py"}])] == ["global-batch"]
    # rank_findings keeps the history itself, per script and not per folder: `scalpel launch` makes a new output
    # folder each time, and a second launch at another world into another folder warns
    first, second = tmp_path / "launch-1" / "watch", tmp_path / "launch-2" / "watch"
    for folder, world in ((first, 2), (second, 4)):
        folder.mkdir(parents=True)
        for r in range(world):
            (folder / f"rank-{r}.facts.json").write_text(json.dumps({**facts[r], "world": world}))
    assert "batch-not-rescaled-for-world" not in [f["rule"] for f in rank_findings(first)]
    (warned,) = [f for f in rank_findings(second) if f["rule"] == "batch-not-rescaled-for-world"]
    assert warned["evidence"][0] == "earlier launch of this script: world 2, per-rank batch 8, lr 0.05"
    assert history_path("/s/train.py").is_file() and not (second / "batch-history.json").exists()
    # another script's history is its own
    assert history_path("/s/other.py") != history_path("/s/train.py")
    # a torn or edited history line is skipped, not a traceback
    history_path("/s/train.py").write_text('[{"script": "/s/train.py", "world": "2", "batch": 8}, 7]')
    assert [f["rule"] for f in rank_findings(second)] == ["global-batch"]


@pytest.mark.dist
def test_relaunch_at_another_world_with_the_same_batch_and_lr_warns(tmp_path):
    rules = []
    for nproc in ("1", "2"):
        out = tmp_path / f"launch-{nproc}"  # a folder per launch, as `scalpel launch` makes by default
        run_ranks(
            "launch",
            "--nproc",
            nproc,
            "--doctor",
            "--steps",
            "6",
            "--out",
            str(out),
            "--",
            str(FIXTURES / "batch_world.py"),
            cwd=tmp_path,
            expect=[out / "launch.json"],
            timeout=280,
        )
        rules.append({f["rule"]: f for f in json.loads((out / "launch.json").read_text())["findings"]})
    assert "batch-not-rescaled-for-world" not in rules[0]
    assert (
        rules[0]["global-batch"]["message"]
        == "global batch 8 = per-rank batch 8 x 1 ranks, optimizer lr 0.05"
    )
    assert rules[1]["batch-not-rescaled-for-world"]["message"].startswith(
        "the world size changed from 1 to 2 ranks with the same per-rank batch 8 and the same lr 0.05"
    )


def test_before_init_judgment():
    from torchscalpel.distributed.rankrules import before_init_findings

    call = {"call": "get_rank", "site": "t.py:5"}
    found = before_init_findings({0: _facts(0, before_init=[call]), 1: _facts(1, before_init=[call])})
    assert found[0]["rule"] == "process-group-before-init" and found[0]["ranks"] == [0, 1]
    assert (
        found[0]["message"]
        == "dist.get_rank() at t.py:5 runs before init_process_group on rank 0: there is no process group yet"
    )
    assert before_init_findings({0: _facts(0)}) == []


@pytest.mark.dist
def test_process_group_before_init_planted_and_clean(tmp_path):
    bad = [
        f
        for f in _doctor(tmp_path / "bad", "pg_before_init_bad.py")
        if f["rule"] == "process-group-before-init"
    ]
    assert len(bad) == 1 and bad[0]["ranks"] == [0, 1], bad
    assert bad[0]["evidence"][0].endswith("pg_before_init_bad.py:12 before init_process_group")
    clean = _doctor(tmp_path / "clean", "pg_before_init_clean.py")
    assert [f["rule"] for f in clean if f["rule"] in SLUGS] == []

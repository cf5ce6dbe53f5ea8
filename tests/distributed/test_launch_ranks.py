"""Two ranks through ``scalpel launch`` (gloo, loopback): parity, exact resume, restarts, SIGTERM, 2 nodes.

Launches are the expensive part (~10 s each on 2 cores), so references are shared per module.
A 2-rank gloo run sometimes aborts at interpreter exit ("terminate called without an active
exception", torch 2.13): a run is judged by what the ranks wrote before exiting, and retried once
only on that exact signature.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import GLOO_EXIT_ABORT, LOOPBACK_ENV, REPO, cli_env, run_ranks

pytestmark = pytest.mark.dist

EXAMPLE = REPO / "examples" / "ddp_fsdp_transformer.py"
SCRIPTS = REPO / "tests" / "distributed" / "scripts"
ENV = LOOPBACK_ENV
TRAIN = ["--steps", "10", "--save-every", "4", "--workers", "2", "--scaler", "--windows", "160"]


def launch(
    cwd: Path, *args: str, expect: Path | None = None, timeout: float = 280
) -> subprocess.CompletedProcess[str]:
    """``scalpel launch --nproc 2 ARGS``; retried once on gloo's known failures (see helpers.run_ranks)."""
    return run_ranks(
        "launch",
        "--nproc",
        "2",
        "--out",
        str(cwd / "launch"),
        *args,
        cwd=cwd,
        timeout=timeout,
        expect=[expect] if expect is not None else None,
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def losses(folder: Path) -> dict[tuple[str, int], str]:
    """Last logged loss per (rank file, step): a relaunch re-logs the steps after its checkpoint."""
    out = {}
    for path in sorted(folder.glob("losses-rank*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out[(path.name, row["step"])] = row["loss"]
    return out


def assert_state_equal(a, b, path: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_state_equal(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_state_equal(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def assert_same_run(ref: Path, other: Path) -> None:
    ref_losses, other_losses = losses(ref / "logs"), losses(other / "logs")
    assert len(ref_losses) == 20 and ref_losses == other_losses
    assert_state_equal(
        torch.load(ref / "final.pt", weights_only=True), torch.load(other / "final.pt", weights_only=True)
    )


def train(cwd: Path, *extra: str, launch_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return launch(
        cwd,
        *launch_args,
        "--",
        str(EXAMPLE),
        *TRAIN,
        "--ckpt",
        "ckpt",
        "--log",
        "logs",
        "--final",
        "final.pt",
        *extra,
        expect=cwd / "final.pt",
    )


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("ddp-ref")
    proc = train(cwd, "--strategy", "ddp")
    assert proc.returncode == 0, _ok(proc)
    return cwd


def test_ddp_and_fsdp_match_single_process(tmp_path):
    out = tmp_path / "parity.json"
    proc = launch(tmp_path, "--", str(SCRIPTS / "parity.py"), str(out), expect=out)
    assert proc.returncode == 0, _ok(proc)
    diffs = json.loads(out.read_text())
    # Tolerance: fp32 AdamW after 4 steps; the only difference is the order of the gradient sum.
    assert diffs["ddp"] < 1e-5 and diffs["fsdp"] < 1e-5, diffs
    assert diffs["guard_stepped"] == [False, False]  # NaN on rank 1 only: both ranks skipped


@pytest.mark.slow
def test_sigterm_saves_exits_143_and_resumes_exactly(tmp_path, ddp_reference):
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel",
        "launch",
        "--nproc",
        "2",
        "--out",
        str(tmp_path / "launch"),
        "--",
        str(EXAMPLE),
        *TRAIN,
        "--strategy",
        "ddp",
        "--ckpt",
        "ckpt",
        "--log",
        "logs",
        "--final",
        "final.pt",
        "--sleep",
        "0.4",
    ]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=cli_env(**ENV), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 240
    while (
        not (tmp_path / "ckpt" / "step-000000004").exists()
        and time.monotonic() < deadline
        and proc.poll() is None
    ):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, output[-3000:]
    assert "stopped by SIGTERM" in output
    assert output.count("SIGTERM received, saved step") == 2, output[-3000:]  # both ranks, same step
    assert not (tmp_path / "final.pt").exists()
    resumed = train(tmp_path, "--strategy", "ddp")
    assert resumed.returncode == 0, _ok(resumed)
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert_same_run(ddp_reference, tmp_path)


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("fsdp-ref")
    proc = train(cwd, "--strategy", "fsdp", "--activation-checkpointing")
    assert proc.returncode == 0, _ok(proc)
    return cwd


def test_two_rank_fsdp_checkpoint_reshards_to_one_process(fsdp_reference, single_rank):
    """Load the 2-rank FSDP checkpoint in one process: full weights equal the consolidated file."""
    import importlib.util

    from safetensors.torch import load_file

    from torchscalpel import distributed as sd

    spec = importlib.util.spec_from_file_location("example_lm", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = sd.wrap(example.TinyLM(), "none")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.8)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    data = sd.loader(example.TextWindows(32, 160), 8, num_workers=0)
    ckpt = sd.Checkpointer(
        fsdp_reference / "ckpt",
        model=model,
        optimizer=opt,
        scheduler=sched,
        scaler=scaler,
        loader=data,
        guard=sd.NonFiniteGuard(model),
        sigterm=False,
    )
    assert ckpt.load() == 8
    full = load_file(str(sd.consolidate(fsdp_reference / "ckpt", fsdp_reference / "full.safetensors")))
    assert set(full) == set(model.state_dict())
    assert all(torch.equal(full[k], v) for k, v in model.state_dict().items())
    assert all(opt.state[p]["exp_avg"].shape == p.shape for p in model.parameters())
    assert sched.last_epoch == 8 and data.epoch * len(data) + data.batches_done == 8 * 2  # 2 ranks' batches


@pytest.mark.slow
def test_sigkill_then_max_restarts_recovers_exactly_with_fsdp(tmp_path_factory, fsdp_reference):
    ref = fsdp_reference
    rng = random.Random()
    die_at, die_rank = rng.randint(1, 9), rng.randint(0, 1)
    cwd = tmp_path_factory.mktemp("fsdp-restart")
    proc = train(
        cwd,
        "--strategy",
        "fsdp",
        "--activation-checkpointing",
        "--die-at",
        str(die_at),
        "--die-rank",
        str(die_rank),
        "--die-attempt",
        "0",
        launch_args=("--max-restarts", "1"),
    )
    assert proc.returncode == 0, f"die at {die_at} on rank {die_rank}: " + _ok(proc)
    attempts = {
        json.loads(line)["attempt"] for line in (cwd / "logs" / "losses-rank0.jsonl").read_text().splitlines()
    }
    assert attempts == {0, 1}, f"the run was not restarted: {attempts}"
    assert_same_run(ref, cwd)


def test_restarts_used_up_names_the_rank(tmp_path):
    proc = launch(tmp_path, "--max-restarts", "1", "--", str(SCRIPTS / "fail.py"))
    assert proc.returncode == 3, _ok(proc)
    assert "scalpel launch: rank 1 failed: exit code 3, after 1 restart" in proc.stderr
    assert "    ValueError: boom: learning rate must be positive" in proc.stderr


@pytest.mark.slow
def test_two_nodes_on_localhost(tmp_path):
    from torchscalpel.netutil import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    procs = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        cmd = [
            sys.executable,
            "-m",
            "torchscalpel",
            "launch",
            "--nnodes",
            "2",
            "--nproc",
            "1",
            "--node-rank",
            str(node),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            "two-nodes",
            "--out",
            str(cwd / "launch"),
            "--",
            str(EXAMPLE),
            "--steps",
            "4",
            "--workers",
            "0",
            "--ckpt",
            str(tmp_path / "ckpt"),
            "--save-every",
            "2",
            "--log",
            str(cwd / "logs"),
        ]
        procs.append(
            subprocess.Popen(
                cmd, cwd=cwd, env=cli_env(**ENV), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    logged = sorted(p.name for p in tmp_path.glob("node*/logs/losses-rank*.jsonl"))
    assert logged == ["losses-rank0.jsonl", "losses-rank1.jsonl"], outputs
    assert any("on 2 ranks" in out for out in outputs), outputs
    assert (tmp_path / "ckpt" / "step-000000004" / "COMMIT").exists()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0 or GLOO_EXIT_ABORT in out, out[-3000:]
    assert os.path.isdir(tmp_path / "ckpt")


@pytest.mark.slow
def test_profile_every_rank_and_merge(tmp_path):
    out = tmp_path / "prof"
    merged_path = out / "launch.json"
    proc = run_ranks(
        "launch",
        "--nproc",
        "2",
        "--profile",
        "--steps",
        "3",
        "--out",
        str(out),
        "--",
        str(EXAMPLE),
        "--steps",
        "40",
        "--workers",
        "0",
        "--ckpt",
        str(tmp_path / "ckpt"),
        cwd=tmp_path,
        timeout=280,
        expect=[merged_path],
    )
    assert merged_path.exists(), _ok(proc)
    merged = json.loads(merged_path.read_text())
    assert [row["rank"] for row in merged["ranks"]] == [0, 1]
    assert all(row["steps"] == 3 and row["collective_ms"] is not None for row in merged["ranks"])
    assert "collective ms" in proc.stdout and "straggler:" in proc.stdout

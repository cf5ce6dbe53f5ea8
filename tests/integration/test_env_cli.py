"""``scalpel env`` end to end through the CLI: screen, --json, exit codes, usage errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import run_cli


def test_env_no_probe_writes_json_and_prints_the_screen(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    proc = run_cli("env", "--no-probe", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    import torch

    assert data["kind"] == "scalpel-env" and data["facts"]["torch"] == torch.__version__
    assert data["probes"] == [] and data["complete"] is True
    assert "scalpel env" in proc.stdout and torch.__version__ in proc.stdout
    assert "Probes skipped (--no-probe)" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_env_with_fast_probes(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    proc = run_cli("env", "--probe", "matmul,lowp", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    probes = json.loads(out.read_text())["probes"]
    assert [(p["name"], p["device"], p["status"]) for p in probes][:2] == [
        ("matmul", "cpu", "ok"),
        ("lowp", "cpu", "ok"),
    ]
    assert "GFLOP/s fp32" in proc.stdout


def test_fail_on_follows_the_findings(tmp_path: Path) -> None:
    # one rank more than this machine's cores: oversubscribed (a warning) whatever the thread count
    ranks = str(len(os.sched_getaffinity(0)) + 1)
    out = tmp_path / "env.json"
    warn = run_cli("env", "--no-probe", "--nproc-per-node", ranks, "--fail-on", "warning", "--json", str(out))
    assert warn.returncode == 1, warn.stdout + warn.stderr
    rules = [f["rule"] for f in json.loads(out.read_text())["findings"]]
    assert "omp-threads-oversubscribed" in rules
    assert "omp-threads-oversubscribed" in warn.stdout
    # the same findings in-process (the exit-code logic, without paying for another torch import)
    from torchscalpel.cli.main import main

    assert main(["env", "--no-probe", "--nproc-per-node", ranks, "--fail-on", "error"]) == 0
    assert main(["env", "--no-probe", "--nproc-per-node", ranks, "--fail-on", "info"]) == 1
    assert main(["env", "--no-probe", "--nproc-per-node", ranks]) == 0  # no --fail-on: 0 whatever is found


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--probe", "matmul,bogus"], "Unknown probe 'bogus'"),
        (["--probe", ","], "--probe names no probe"),
        (["--no-probe", "--probe", "matmul"], "contradict each other"),
        (["--fail-on", "fatal"], "--fail-on 'fatal' is not a level"),
        (["--probe-timeout", "0"], "--probe-timeout must be a positive number"),
        (["--nproc-per-node", "0"], "--nproc-per-node must be at least 1"),
        (["--no-probe", "--json", "."], "is a folder"),
        (["--no-probe", "--json", "README.md/env.json"], "Cannot write --json"),
    ],
)
def test_usage_errors_are_one_sentence_and_exit_2(args: list[str], message: str) -> None:
    proc = run_cli("env", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_env_with_every_probe(tmp_path: Path) -> None:
    """All probes, as a user runs it: a real inductor compile (15-25 s cold) and a 2-rank gloo all_reduce."""
    out = tmp_path / "env.json"
    proc = run_cli("env", "--json", str(out), timeout=400)
    assert proc.returncode == 0, proc.stderr
    probes = {p["name"]: p for p in json.loads(out.read_text())["probes"]}
    assert set(probes) == {"matmul", "lowp", "compile", "allreduce"}
    assert probes["compile"]["status"] == "ok", probes["compile"]["detail"]
    assert (
        probes["compile"]["metrics"]["backend"] == "inductor"
        and probes["compile"]["metrics"]["compile_s"] > 0
    )
    assert probes["allreduce"]["status"] == "ok", probes["allreduce"]["detail"]

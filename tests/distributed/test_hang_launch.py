"""Planted hangs through ``scalpel launch`` (gloo, loopback): the right ranks and lines named, quickly, no process left.

Each launch costs ~15 s on 2 cores. A run is judged by what it wrote (``hang.json``,
``collective-mismatch.json``, its output), never by wall-clock timings measured here: the
hang watch records how long after the last progress it stopped the job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from helpers import LOOPBACK_ENV, REPO, cli_env

pytestmark = pytest.mark.dist

FIXTURES = REPO / "tests" / "fixtures" / "distributed"
TIMEOUT = 6


def launch(
    tmp_path: Path, fixture: str, *args: str, nproc: int = 2, script_args: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "launch"
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel",
        "launch",
        "--nproc",
        str(nproc),
        "--out",
        str(out),
        *args,
        "--",
        str(FIXTURES / fixture),
        *script_args,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=cli_env(**LOOPBACK_ENV),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), out


def leftovers(fixture: str) -> list[str]:
    """Processes still running the fixture (the ranks, their DataLoader workers)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if fixture in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(f"{p.info['pid']}: {cmd}")
    return found


def hang_of(proc: subprocess.CompletedProcess[str], out: Path, fixture: str) -> dict:
    assert proc.returncode == 124, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    hang = json.loads((out / "hang.json").read_text())
    assert hang["torn_down_after_s"] < 2 * TIMEOUT, (
        hang
    )  # as the watch measured it: well before torch's timeout
    assert (out / "hang.txt").read_text().startswith("scalpel launch: hang:")
    assert leftovers(fixture) == []
    return hang


def test_a_rank_that_skips_an_all_reduce_is_caught_before_the_hang_and_named(tmp_path):
    proc, out = launch(
        tmp_path, "hang_skip_allreduce.py", "--hang-timeout", str(TIMEOUT), "--check-collectives"
    )
    hang = hang_of(proc, out, "hang_skip_allreduce.py")
    assert hang["summary"] == (
        "the ranks disagree: rank 0 is in all_reduce #18 from hang_skip_allreduce.py:20; "
        "rank 1 is in barrier #18 from hang_skip_allreduce.py:21"
    )
    mismatch = json.loads((out / "collective-mismatch.json").read_text())
    assert mismatch["seq"] == 18 and mismatch["ranks"]["1"]["op"] == "barrier"
    assert mismatch["ranks"]["0"]["site"].endswith("hang_skip_allreduce.py:20")
    # the desync was reported while the job ran, before the hang report
    assert proc.stderr.index("collective #18 differs across ranks") < proc.stderr.index(
        "scalpel launch: hang:"
    )
    ranks = hang["ranks"]
    assert ranks["1"]["collective"]["op"] == "barrier" and ranks["0"]["collective"]["shapes"] == [[]]
    assert any(line.endswith("hang_skip_allreduce.py:21 in <module>") for line in ranks["1"]["stack"])


def test_collectives_in_a_different_order_are_named(tmp_path):
    proc, out = launch(tmp_path, "hang_order.py", "--hang-timeout", str(TIMEOUT))
    hang = hang_of(proc, out, "hang_order.py")
    assert "rank 0 is in all_reduce #17 from hang_order.py:22" in hang["summary"]
    assert "rank 1 is in broadcast #17 from hang_order.py:17" in hang["summary"]
    assert not (out / "collective-mismatch.json").exists()  # not asked for: found at the hang instead
    assert hang["mismatch"]["seq"] == 17


def test_a_rank_stuck_in_its_data_loader_is_the_one_named(tmp_path):
    proc, out = launch(tmp_path, "hang_loader.py", "--hang-timeout", str(TIMEOUT))
    hang = hang_of(proc, out, "hang_loader.py")
    assert hang["diverging_ranks"] == [1]
    assert hang["summary"].startswith(
        "rank 1 is not in a collective: at hang_loader.py:20 in __getitem__ "
        "(inside a DataLoader); rank 0 is in backward() from hang_loader.py:31"
    )


def test_a_shape_mismatch_that_aborts_a_rank_is_explained(tmp_path):
    proc, _ = launch(tmp_path, "hang_shape.py", "--hang-timeout", str(TIMEOUT))
    assert proc.returncode not in (0, 124), proc.stderr[-3000:]
    assert (
        "before it failed, collective #12 differs across ranks: rank 0 calls all_reduce [4] float32 from "
        "hang_shape.py:18; rank 1 calls all_reduce [5] float32 from hang_shape.py:18"
    ) in proc.stderr
    assert leftovers("hang_shape.py") == []


def test_a_rank_that_dies_when_asked_is_reported_dead_with_its_signal(tmp_path):
    proc, out = launch(tmp_path, "hang_dies_when_asked.py", "--hang-timeout", str(TIMEOUT))
    hang = hang_of(proc, out, "hang_dies_when_asked.py")
    assert hang["diverging_ranks"] == [1]
    assert hang["ranks"]["1"]["where"] == "dead (killed by SIGUSR2 while asked for its stack)"


def test_doctor_puts_the_mismatch_first(tmp_path):
    proc, out = launch(tmp_path, "hang_skip_allreduce.py", "--doctor", "--hang-timeout", str(TIMEOUT))
    hang_of(proc, out, "hang_skip_allreduce.py")
    findings = json.loads((out / "launch.json").read_text())["findings"]
    assert [f["rule"] for f in findings[:2]] == ["collective-mismatch", "rank-hang"]
    assert "rank 1 calls barrier from hang_skip_allreduce.py:21" in findings[0]["message"]


def test_a_rank_that_still_computes_is_not_a_hang(tmp_path):
    proc, out = launch(tmp_path, "slow_but_alive.py", "--hang-timeout", "3", script_args=("14",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 is still working (its stack, CPU time or I/O moves); still watching" in proc.stderr
    assert "rank 0 finished" in proc.stdout and "rank 1 finished" in proc.stdout
    assert not (out / "hang.json").exists()


# 4 ranks (the checks: the same planted hangs at 2 and 4 ranks). Slow: ~4 processes on 2 cores each.
@pytest.mark.slow
def test_four_ranks_name_the_one_that_skipped_and_the_check_finds_it_first(tmp_path):
    proc, out = launch(
        tmp_path, "hang_skip_allreduce.py", "--hang-timeout", str(TIMEOUT), "--check-collectives", nproc=4
    )
    hang = hang_of(proc, out, "hang_skip_allreduce.py")
    assert hang["diverging_ranks"] == [1]
    assert hang["summary"] == (
        "rank 1 is in barrier #18 from hang_skip_allreduce.py:21; "
        "ranks 0, 2, 3 are in all_reduce #18 from hang_skip_allreduce.py:20"
    )
    mismatch = json.loads((out / "collective-mismatch.json").read_text())
    assert mismatch["seq"] == 18 and mismatch["minority"] == [1]
    assert mismatch["message"] == (
        "collective #18 differs across ranks: rank 1 calls barrier from "
        "hang_skip_allreduce.py:21; ranks 0, 2, 3 call all_reduce [] float32 from "
        "hang_skip_allreduce.py:20"
    )
    assert proc.stderr.index("collective #18 differs across ranks") < proc.stderr.index(
        "scalpel launch: hang:"
    )


@pytest.mark.slow
def test_four_ranks_in_different_orders_name_the_one_that_broadcast_first(tmp_path):
    proc, out = launch(tmp_path, "hang_order.py", "--hang-timeout", str(TIMEOUT), nproc=4)
    hang = hang_of(proc, out, "hang_order.py")
    assert hang["diverging_ranks"] == [1]
    assert hang["summary"] == (
        "rank 1 is in broadcast #17 from hang_order.py:17; "
        "ranks 0, 2, 3 are in all_reduce #17 from hang_order.py:22"
    )
    assert hang["mismatch"]["seq"] == 17 and hang["mismatch"]["minority"] == [1]


@pytest.mark.slow
def test_four_ranks_with_a_shape_that_differs_name_the_rank_and_line(tmp_path):
    # At 2 ranks gloo aborts on the size mismatch; at 4 its ring lets two ranks through and the job hangs.
    # Either way the diagnosis must name rank 1 and line 18, found before any hang by the check.
    proc, out = launch(
        tmp_path, "hang_shape.py", "--hang-timeout", str(TIMEOUT), "--check-collectives", nproc=4
    )
    expected = (
        "collective #12 differs across ranks: rank 1 calls all_reduce [5] float32 from hang_shape.py:18; "
        "ranks 0, 2, 3 call all_reduce [4] float32 from hang_shape.py:18"
    )
    assert json.loads((out / "collective-mismatch.json").read_text())["message"] == expected
    if proc.returncode == 124:
        hang = hang_of(proc, out, "hang_shape.py")
        assert hang["diverging_ranks"] == [1]
        assert hang["summary"].startswith(f"rank 1 diverged first, {expected}; now ")
    else:
        assert proc.returncode != 0 and f"before it failed, {expected}" in proc.stderr, proc.stderr[-3000:]
        assert leftovers("hang_shape.py") == []


@pytest.mark.slow
def test_four_ranks_with_one_stuck_in_its_data_loader_name_it(tmp_path):
    proc, out = launch(tmp_path, "hang_loader.py", "--hang-timeout", str(TIMEOUT), nproc=4)
    hang = hang_of(proc, out, "hang_loader.py")
    assert hang["diverging_ranks"] == [1]
    assert hang["summary"].startswith(
        "rank 1 is not in a collective: at hang_loader.py:20 in __getitem__ "
        "(inside a DataLoader); ranks 0, 2, 3 are in backward() from hang_loader.py:31"
    )

"""The guard in tests/unit/conftest.py is in place: every way to start a process fails a unit test.

Each test would start a real (harmless) process if the guard were gone, and then fails: a fork's child exits
at once, a started process is waited for, so a missing guard shows as a failure and not as a stray pytest.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess

import pytest

GUARD = "tests/unit must not start a process: move this test to tests/integration"


def test_subprocess_run_is_refused() -> None:
    with pytest.raises(AssertionError, match=GUARD) as refused:
        subprocess.run(["true"], check=False)
    assert "'true'" in str(refused.value), "the message names the command"


def test_check_output_and_os_popen_are_refused() -> None:
    with pytest.raises(AssertionError, match=GUARD):
        subprocess.check_output(["true"])
    with pytest.raises(AssertionError, match=GUARD):
        os.popen("true").close()


def test_os_system_is_refused() -> None:
    with pytest.raises(AssertionError, match=GUARD):
        os.system("true")


def test_os_fork_is_refused() -> None:
    with pytest.raises(AssertionError, match=GUARD):
        pid = os.fork()
        if pid == 0:  # only without the guard: the child must not go on running pytest
            os._exit(0)
        os.waitpid(pid, 0)


def test_posix_spawn_is_refused() -> None:
    for spawn, program in ((os.posix_spawn, "/bin/true"), (os.posix_spawnp, "true")):
        with pytest.raises(AssertionError, match=GUARD):
            pid = spawn(program, [program], dict(os.environ))
            os.waitpid(pid, 0)


def _nothing() -> None:
    return None


def test_multiprocessing_start_is_refused() -> None:
    process = multiprocessing.get_context("spawn").Process(target=_nothing)
    with pytest.raises(AssertionError, match=GUARD):
        process.start()
        process.join(60)


def test_torch_multiprocessing_is_refused() -> None:
    import torch.multiprocessing as tmp

    with pytest.raises(AssertionError, match=GUARD):
        tmp.start_processes(_nothing_rank, nprocs=1, start_method="spawn")
    with pytest.raises(AssertionError, match=GUARD):
        tmp.spawn(_nothing_rank, nprocs=1)


def _nothing_rank(rank: int) -> None:
    return None

"""Helpers for tests that run the ``scalpel`` CLI in a subprocess against this checkout's sources."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that imports torchscalpel from this checkout's src/."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 240, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m torchscalpel ARGS`` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "torchscalpel", *args],
        cwd=cwd or REPO,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


GLOO_EXIT_ABORT = "terminate called without an active exception"
"""What a 2-rank gloo run sometimes prints when it aborts at interpreter exit (torch 2.13, loaded 2-core
machines) after its work is done: such a run is judged by what it wrote."""
LOOPBACK_ENV = {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def run_ranks(*args: str, expect: list[Path] | None = None, cwd: Path | None = None, timeout: float = 300,
              **env: str) -> subprocess.CompletedProcess[str]:
    """``run_cli`` for a multi-rank command on loopback gloo, retried once only on the known exit abort.

    An aborted run whose ``expect`` files all exist counts as a success (its work was done)."""
    proc = None
    for _attempt in range(2):
        proc = run_cli(*args, cwd=cwd, timeout=timeout, **{**LOOPBACK_ENV, **env})
        if proc.returncode == 0 or GLOO_EXIT_ABORT not in proc.stdout + proc.stderr:
            return proc
        if expect and all(p.exists() for p in expect):
            return subprocess.CompletedProcess(proc.args, 0, proc.stdout, proc.stderr)
    assert proc is not None
    return proc

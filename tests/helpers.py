"""Helpers for tests that run the ``scalpel`` CLI in a subprocess against this checkout's sources."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COMMITTED_TRACES = REPO / "tests" / "data" / "traces"
"""Small synthetic Kineto-shaped traces (gpu_2rank/, cpu_only/, rocm_mi250/, compare/), written by
scripts/make_test_traces.py, whose every figure is known; always present, unlike ../shared."""


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that imports torchscalpel from this checkout's src/."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 240, errors: str = "strict", **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m torchscalpel ARGS`` and capture its output (``errors``: the decoder's, e.g.
    ``surrogateescape`` for a patch that carries a latin-1 file's own bytes)."""
    return subprocess.run(
        [sys.executable, "-m", "torchscalpel", *args],
        cwd=cwd or REPO,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        errors=errors,
        timeout=timeout,
        check=False,
    )


GLOO_EXIT_ABORT = "terminate called without an active exception"
"""What a 2-rank gloo run sometimes prints when it aborts at interpreter exit (torch 2.13, loaded 2-core
machines) after its work is done: such a run is judged by what it wrote."""
LOOPBACK_ENV = {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def _run_killing_the_tree(
    args: list[str], cwd: Path | None, timeout: float, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run a command in its own session; on timeout kill the whole tree (the ranks too) and return
    what it printed with exit code -9, instead of raising and leaving orphaned ranks behind."""
    proc = subprocess.Popen(
        args,
        cwd=cwd or REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(
            args, -9, out, err + f"\n[test helper: killed after {timeout:.0f} s]"
        )


def run_ranks(
    *args: str, expect: list[Path] | None = None, cwd: Path | None = None, timeout: float = 280, **env: str
) -> subprocess.CompletedProcess[str]:
    """``run_cli`` for a multi-rank command on loopback gloo, retried once on gloo's known failures.

    Two failures are retried: the exit-time abort (an aborted run whose ``expect`` files all exist
    counts as a success: its work was done), and a hang, which on a loaded 2-core machine gloo's
    rendezvous occasionally produces. ``timeout`` is the budget for both attempts together, so the
    call ends inside pytest's own per-test limit and a hung attempt's ranks are killed, not orphaned."""
    cmd = [sys.executable, "-m", "torchscalpel", *args]
    full_env = cli_env(**{**LOOPBACK_ENV, **env})
    proc = None
    for attempt in range(2):
        proc = _run_killing_the_tree(cmd, cwd, timeout / 2, full_env)
        if proc.returncode == -9 and attempt == 0:
            continue
        if proc.returncode == 0 or GLOO_EXIT_ABORT not in proc.stdout + proc.stderr:
            return proc
        if expect and all(p.exists() for p in expect):
            return subprocess.CompletedProcess(proc.args, 0, proc.stdout, proc.stderr)
    assert proc is not None
    return proc


def assert_training_breakdown(record: Any) -> None:
    """Every measured step of a training run is split for real: forward, backward and optimizer
    were each timed (an un-timed phase would hide inside ``other``), the timed phases never
    exceed the step, and ``other`` is exactly the remainder."""
    steps = record.measured_steps
    assert steps, "no measured steps"
    for s in steps:
        timed = s.data_ms + s.forward_ms + s.backward_ms + s.optimizer_ms
        assert s.forward_ms > 0 and s.backward_ms > 0 and s.optimizer_ms > 0, s
        assert timed <= s.total_ms * (1 + 1e-9), s
        assert abs(timed + s.other_ms - s.total_ms) <= 1e-6 * max(s.total_ms, 1.0), s

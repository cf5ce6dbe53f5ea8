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

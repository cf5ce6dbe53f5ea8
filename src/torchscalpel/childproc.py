"""Child processes that run this torchscalpel: their environment, and killing them with what they started."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
"""The folder that holds the ``torchscalpel`` package: a child imports this same copy."""


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with this torchscalpel first on ``PYTHONPATH`` (a source checkout is
    not always installed), unbuffered output, and ``extra`` on top."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a child started with ``start_new_session=True`` and everything it started (inductor's
    compile workers, DataLoader workers); falls back to the child alone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()

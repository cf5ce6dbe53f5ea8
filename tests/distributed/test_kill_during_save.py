"""Short kill-during-save soak (the full 200-point one is benchmarks/kill_during_save_soak.py)."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from helpers import REPO

pytestmark = pytest.mark.dist


def _soak_module():
    # The forkserver is a fresh interpreter: point it at this checkout's sources.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    # A real import (not from a file spec): the soak's forkserver children import it by name.
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    return importlib.import_module("kill_during_save_soak")


def test_latest_is_never_broken_after_sigkill_during_save(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    result = _soak_module().run_trials(kills=5, seed=os.getpid(), root=tmp_path / "ckpt")
    assert result["problems"] == [], result
    assert result["final_step"] > 0, result  # at least one save committed between kills


def test_verify_catches_a_broken_latest(tmp_path):
    """The soak's own check must fail on a corrupted checkpoint (otherwise the soak proves nothing)."""
    soak = _soak_module()
    result = soak.run_trials(kills=1, seed=1, root=tmp_path / "ckpt")
    assert result["problems"] == []
    from torchscalpel.distributed import manifest

    latest = manifest.latest(tmp_path / "ckpt")
    target = next(latest.glob("*.distcp"))
    blob = bytearray(target.read_bytes())
    blob[-10] ^= 0x01
    target.write_bytes(bytes(blob))
    _step, problem = soak.verify(tmp_path / "ckpt")
    assert problem is not None and "broken" in problem

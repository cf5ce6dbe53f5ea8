"""The compile probe runs in a child process: it compiles there, is killed at its timeout, and a failure is one
line (moved from tests/unit/test_env_probes.py, which keeps the in-process probes)."""

from __future__ import annotations

import pytest

from torchscalpel.envcheck import probes


def test_compile_probe_times_out_and_kills_its_child(monkeypatch: pytest.MonkeyPatch) -> None:
    spawned = []
    real = probes._spawn

    def spy(argv, env):  # type: ignore[no-untyped-def]
        proc = real(argv, env)
        spawned.append(proc)
        return proc

    monkeypatch.setattr(probes, "_spawn", spy)
    r = probes.compile_probe("cpu", timeout=0.5)
    assert r.status == "timeout" and "0.5 s" in r.detail
    assert spawned and spawned[0].poll() is not None  # killed, not left running


def test_compile_probe_in_a_child_with_a_fast_backend() -> None:
    r = probes.compile_probe("cpu", timeout=120, backend="aot_eager")
    assert r.status == "ok", r.detail
    assert r.metrics["max_abs_err"] < 1e-4 and r.metrics["compile_s"] > 0


@pytest.mark.slow
def test_compile_probe_failure_is_one_line() -> None:
    r = probes.compile_probe("cpu", timeout=120, backend="no_such_backend")
    assert r.status == "failed"
    assert "no_such_backend" in r.detail and "\n" not in r.detail

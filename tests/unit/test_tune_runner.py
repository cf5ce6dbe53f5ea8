"""How a trial's failures are classified, its environment and command (tests/integration/test_tune_trials.py
runs real trial processes)."""

from __future__ import annotations

from pathlib import Path

from torchscalpel.runtime.target import Target
from torchscalpel.tune.runner import _signal_cause, child_env, classify_error, trial_command
from torchscalpel.tune.settings import CompileSpec, DataLoaderSpec, TuneSettings


def test_error_classification():
    assert classify_error("RuntimeError: CUDA out of memory. Tried", 1).startswith("out of memory")
    assert classify_error("BackendCompilerFailed: backend='inductor' raised: x", 1).startswith(
        "compile error"
    )
    assert classify_error("ValueError: bad", 1) == "crashed: ValueError: bad"
    assert "most likely out of memory" in _signal_cause(-9)
    assert _signal_cause(0) is None


def test_child_env_and_command(monkeypatch):
    # Judged on a clean environment: a developer's own TORCHINDUCTOR_COMPILE_THREADS must not decide it.
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    env = child_env(TuneSettings(compile=CompileSpec(), dataloader=DataLoaderSpec(num_workers=2)), Path("/c"))
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in child_env(TuneSettings(compile=CompileSpec()), None)
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in child_env(
        TuneSettings(dataloader=DataLoaderSpec(num_workers=2)), None
    )
    cmd = trial_command(
        Target(module="pkg.train", args=["--x"]),
        TuneSettings(amp="bf16"),
        Path("o"),
        warmup=1,
        steps=2,
        seed=7,
        facts=True,
    )
    assert cmd[cmd.index("--settings") + 1] == '{"amp": "bf16"}'
    assert cmd[-4:] == ["-m", "pkg.train", "--", "--x"]
    assert "--facts" in cmd and cmd[cmd.index("--seed") + 1] == "7"

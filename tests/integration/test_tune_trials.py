"""The trial process, run for real: what it records, and how crashes, OOMs and overruns are reported.

Each test starts a trial process (Python, torch and the script: several seconds each on 2 cores), so they live here
rather than in tests/unit, which ``make test-fast`` runs in the edit loop.
"""

from __future__ import annotations

import time
from pathlib import Path

from torchscalpel.runtime.target import Target
from torchscalpel.tune.runner import run_trial
from torchscalpel.tune.settings import TuneSettings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tune"


def test_trial_records_steps_losses_facts_and_apply_log(tmp_path):
    target = Target(script=FIXTURES / "tiny_train.py", args=["--steps", "30"])
    result = run_trial(
        target,
        TuneSettings(threads=1),
        tmp_path / "t",
        warmup=1,
        steps=3,
        seed=0,
        timeout_s=120,
        family="threads",
        facts=True,
        module_times=True,
    )
    assert result.status == "ok", result.cause
    assert len(result.step_ms) == 3 and result.median_ms > 0
    assert len(result.losses) == 4 and all(v is not None for v in result.losses)
    assert result.apply["fired"] == ["threads"]
    assert result.facts["models"] == ["Net"] and result.facts["loaders"] == 1
    assert result.facts["optimizers"] == ["AdamW"]
    assert result.facts["repeated"][0]["cls"] == "Block"
    assert result.peak_bytes and result.peak_bytes > 10_000_000
    # same seed, exact knob: the loss curve of a second run is identical
    again = run_trial(target, TuneSettings(), tmp_path / "u", warmup=1, steps=3, seed=0, timeout_s=120)
    assert again.losses == result.losses


def test_mingpt_baseline_facts_name_the_called_block_not_the_moduledict(tmp_path):
    target = Target(script=FIXTURES / "mingpt_train.py", args=["--steps", "10"])
    result = run_trial(
        target,
        TuneSettings(),
        tmp_path / "g",
        warmup=1,
        steps=2,
        seed=0,
        timeout_s=120,
        facts=True,
        module_times=True,
    )
    assert result.status == "ok", result.cause
    assert [r["cls"] for r in result.facts["repeated"]] == ["Block"]
    assert result.facts["repeated"][0]["count"] == 2 and result.facts["uncalled_blocks"] == []


def test_script_crash_is_reported_with_its_cause(tmp_path):
    result = run_trial(
        Target(script=FIXTURES / "crasher.py"),
        TuneSettings(),
        tmp_path / "c",
        warmup=0,
        steps=10,
        seed=0,
        timeout_s=120,
    )
    assert result.status == "failed"
    assert result.cause.startswith("out of memory: RuntimeError: CUDA out of memory")
    assert len(result.losses) == 3  # what was measured before the crash is kept


def test_trial_over_its_share_is_stopped_with_its_children(tmp_path):
    start = time.monotonic()
    result = run_trial(
        Target(script=FIXTURES / "sleeper.py"),
        TuneSettings(),
        tmp_path / "s",
        warmup=0,
        steps=50,
        seed=0,
        timeout_s=15,
    )
    assert result.status == "timeout" and "its share of the budget" in result.cause
    assert time.monotonic() - start < 60
    out = (tmp_path / "s" / "stdout.txt").read_text()
    if "CHILD" in out:  # the grandchild was killed with the trial's process group
        pid = int(out.split("CHILD")[1].split()[0])
        assert _gone_or_zombie(pid)


def _gone_or_zombie(pid: int, wait_s: float = 10.0) -> bool:
    """True once ``pid`` no longer runs (a killed orphan may stay a zombie until init reaps it)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.2)
    return False

"""``scalpel memory`` end to end on the OOM fixtures: the breakdown, the named cause, the ladder, the fix that fits."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from helpers import REPO, run_cli

FIX = REPO / "tests" / "fixtures" / "memory"


def _memory(tmp_path: Path, script: str, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "run"
    js = tmp_path / "memory.json"
    proc = run_cli(
        "memory",
        "--steps",
        "all",
        "--out",
        str(out),
        "--json",
        str(js),
        *args,
        "--",
        str(FIX / script),
        OMP_NUM_THREADS="1",
    )
    assert js.is_file(), proc.stderr[-2000:]
    return proc.returncode, json.loads(js.read_text()), proc.stdout


def test_breakdown_without_a_limit(tmp_path: Path) -> None:
    code, m, out = _memory(tmp_path, "deep_transformer.py", "--no-plan")
    assert code == 0 and "oom" not in m
    peak = m["peak"]
    assert sum(peak["by_category"].values()) == peak["breakdown_total"]
    assert peak["breakdown_total"] >= 0.99 * peak["total"]
    assert m["top_cause"]["key"] == "activations"
    assert peak["by_category"]["optimizer_state"] > 0 and peak["by_category"]["parameters"] > 0
    assert any(mod["name"].startswith("blocks.") for mod in peak["modules"])
    assert peak["sites"][0]["name"].startswith(str(FIX / "deep_transformer.py") + ":")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["sections"]["memory"]["peak"]["total"] == peak["total"]
    html = (tmp_path / "run" / "report.html").read_text()
    assert 'id="memory"' in html and "At the peak" in html
    assert "peak live tensors" in out


@pytest.mark.slow
def test_activation_oom_names_activations_and_the_checkpointing_fix_fits(tmp_path: Path) -> None:
    code, m, out = _memory(tmp_path, "deep_transformer.py", "--memory-limit", "40MiB")
    assert code == 1 and "OUT OF MEMORY" in out
    oom = m["oom"]
    assert m["top_cause"]["key"] == "activations"
    assert oom["live"] > 40 * 2**20 and oom["request"]["site"].startswith(str(FIX / "deep_transformer.py"))
    assert Path(oom["snapshot"]["live"]).is_file()
    first = oom["ladder"][0]
    assert first["kind"] == "checkpoint-blocks" and first["fits"] and first["saves"] > 0
    assert oom["plan"]["blocks"] == 8 and oom["plan"]["max_batch"] < 32
    toml = tmp_path / "scalpel.toml"
    for rung in oom["ladder"]:
        if rung["config"] and rung["fits"] and rung["kind"] in ("checkpoint-blocks", "micro-batches"):
            toml.write_text(
                "[tune]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in rung["config"].items())
            )
            fixed = run_cli(
                "run",
                "--memory-limit",
                "40MiB",
                "--config",
                str(toml),
                "--",
                str(FIX / "deep_transformer.py"),
                OMP_NUM_THREADS="1",
            )
            assert fixed.returncode == 0, (rung, fixed.stderr[-1500:])
            assert "under the limit" in fixed.stderr
    plain = run_cli(
        "run",
        "--memory-limit",
        "40MiB",
        "--config",
        str(tmp_path / "none.toml"),
        "--",
        str(FIX / "deep_transformer.py"),
        OMP_NUM_THREADS="1",
    )
    assert plain.returncode == 2  # the config file does not exist: one sentence
    (tmp_path / "none.toml").write_text("[tune]\n")
    plain = run_cli(
        "run",
        "--memory-limit",
        "40MiB",
        "--config",
        str(tmp_path / "none.toml"),
        "--",
        str(FIX / "deep_transformer.py"),
        OMP_NUM_THREADS="1",
    )
    assert plain.returncode == 1 and "memory limit 40.0 MiB exceeded" in plain.stderr


def _final_loss(stdout: str) -> float:
    return float(next(line for line in stdout.splitlines() if line.startswith("done")).split()[1])


@pytest.mark.slow
def test_checkpointing_with_microbatches_fits_and_keeps_the_loss(tmp_path: Path) -> None:
    script = str(FIX / "deep_transformer.py")
    none, both = tmp_path / "none.toml", tmp_path / "both.toml"
    none.write_text("[tune]\n")
    both.write_text('[tune]\ncheckpointing = "blocks"\nmicrobatches = 4\n')
    plain = run_cli("run", "--config", str(none), "--", script, "--steps", "2", OMP_NUM_THREADS="1")
    fixed = run_cli(
        "run",
        "--memory-limit",
        "40MiB",
        "--show",
        "--config",
        str(both),
        "--",
        script,
        "--steps",
        "2",
        OMP_NUM_THREADS="1",
    )
    assert plain.returncode == 0 and fixed.returncode == 0, fixed.stderr[-1500:]
    assert "under the limit" in fixed.stderr
    assert "activation checkpointing of 8 Block blocks" in fixed.stderr and "4 micro-batches" in fixed.stderr
    assert abs(_final_loss(fixed.stdout) - _final_loss(plain.stdout)) <= 1e-5 * abs(_final_loss(plain.stdout))


@pytest.mark.slow
def test_optimizer_state_and_growth_are_named(tmp_path: Path) -> None:
    _, m, _ = _memory(tmp_path, "big_optimizer.py", "--memory-limit", "20MiB")
    assert m["top_cause"]["key"] == "optimizer_state"
    assert m["oom"]["request"]["phase"] == "optimizer"
    assert any(r["kind"] == "optimizer" for r in m["oom"]["ladder"])
    _, m, out = _memory(tmp_path, "logged_losses.py", "--memory-limit", "40MiB", "--no-plan")
    assert m["top_cause"]["key"] == "growth"
    g = m["growth"]
    assert g["sites"][0]["site"] == f"{FIX / 'logged_losses.py'}:16"
    assert 1.5 * 2**20 < g["per_step"] < 2.5 * 2**20 and g["kept"]["activations"] > 0
    assert m["oom"]["ladder"][0]["kind"] == "detach-kept"
    assert "memory grows" in out


def test_snapshot_mode(tmp_path: Path) -> None:
    good = tmp_path / "good.pickle"
    good.write_bytes(
        pickle.dumps(
            {
                "segments": [
                    {
                        "total_size": 2048,
                        "blocks": [
                            {
                                "size": 2048,
                                "state": "active_allocated",
                                "frames": [{"filename": "/u/train.py", "line": 3, "name": "f"}],
                            }
                        ],
                    }
                ]
            }
        )
    )
    proc = run_cli("memory", str(good))
    assert proc.returncode == 0 and "/u/train.py:3" in proc.stdout
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps({"segments": [Path("x")]}))
    proc = run_cli("memory", str(bad))
    assert proc.returncode == 2 and "refuses" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_tune_fit_writes_a_config_that_fits(tmp_path: Path) -> None:
    config = tmp_path / "scalpel.toml"
    proc = run_cli(
        "tune",
        "--fit",
        "40MiB",
        "--steps",
        "3",
        "--out",
        str(tmp_path / "fit"),
        "--config",
        str(config),
        "--",
        str(FIX / "deep_transformer.py"),
        "--steps",
        "5",
        OMP_NUM_THREADS="1",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    fit = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert not fit["trials"][0]["fits"] and fit["winner"]["fits"]
    assert all(t["fits"] for t in fit["trials"] if t["label"] == fit["winner"]["label"])
    check = run_cli(
        "run",
        "--memory-limit",
        "40MiB",
        "--config",
        str(config),
        "--",
        str(FIX / "deep_transformer.py"),
        OMP_NUM_THREADS="1",
    )
    assert check.returncode == 0 and "under the limit" in check.stderr
    bad = run_cli("tune", "--fit", "40M", "--", str(FIX / "deep_transformer.py"))
    assert bad.returncode == 2 and "--fit" in bad.stderr

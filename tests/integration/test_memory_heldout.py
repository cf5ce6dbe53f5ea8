"""`scalpel memory` on the held-out OOM scripts (tests/fixtures/memory/heldout/): one test per failure class found.

Each runs a script in the style users write under ``--memory-limit``, checks the named cause and the ladder's
numbers, then applies the fix (``scalpel run --memory-limit --config``, or the code change the rung names, to a
copy) and checks that it completes under the same limit. Tiny models, few steps.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

import torchscalpel
from helpers import REPO, run_cli

HELD = REPO / "tests" / "fixtures" / "memory" / "heldout"


def _memory(tmp_path: Path, script: Path, limit: str, *args: str) -> dict:
    js = tmp_path / f"{script.stem}.json"
    proc = run_cli(
        "memory",
        "--steps",
        "all",
        "--memory-limit",
        limit,
        "--no-report",
        "--out",
        str(tmp_path / "run"),
        "--json",
        str(js),
        *args,
        "--",
        str(script),
        OMP_NUM_THREADS="1",
    )
    assert proc.returncode == 1 and js.is_file(), proc.stderr[-2000:]
    return json.loads(js.read_text())


def _run_fixed(
    tmp_path: Path, script: Path, limit: str, config: dict | None = None, code: tuple[str, str] | None = None
) -> int | None:
    """``scalpel run --memory-limit`` with a rung's config and/or a code change; the peak it printed (None: failed)."""
    toml = tmp_path / "fix.toml"
    toml.write_text("[tune]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in (config or {}).items()))
    target = script
    if code is not None:
        source = script.read_text()
        assert code[0] in source
        target = tmp_path / f"fixed_{script.name}"
        target.write_text(source.replace(code[0], code[1]))
    proc = run_cli(
        "run", "--memory-limit", limit, "--config", str(toml), "--", str(target), OMP_NUM_THREADS="1"
    )
    if proc.returncode != 0:
        return None
    line = next(ln for ln in proc.stderr.splitlines() if "under the limit" in ln)
    from torchscalpel.units import parse_size

    number, unit = line.split("peak live tensors ")[1].split(" under")[0].split()
    return parse_size(f"{number}{unit}", flag="peak")


@pytest.mark.slow
def test_transformers_model_called_with_keywords_gets_plan_numbers_and_checkpointing_fits(
    tmp_path: Path,
) -> None:
    # Found: the plan read model(**batch)'s keywords only as the call returned, which an OOM forward never does
    # ("You have to specify either input_ids"); then checkpointing GPT-2 blocks wrote the KV cache twice.
    script = HELD / "hf_gpt2_finetune.py"
    m = _memory(tmp_path, script, "128MiB")
    oom = m["oom"]
    assert m["top_cause"]["key"] == "activations" and oom["plan"] and not oom["plan_error"]
    first = oom["ladder"][0]
    assert (
        first["kind"] == "checkpoint-blocks"
        and first["fits"]
        and first["config"] == {"checkpointing": "blocks"}
    )
    measured = _run_fixed(tmp_path, script, "128MiB", first["config"])
    assert measured is not None and measured <= 128 * 2**20
    assert (
        abs(measured - first["peak"]) <= 0.15 * measured
    )  # the plan's peak with the rung, against scalpel run


@pytest.mark.slow
def test_data_preparation_before_training_is_named_and_its_fix_fits(tmp_path: Path) -> None:
    script = HELD / "data_prep_peak.py"
    m = _memory(tmp_path, script, "96MiB")
    assert m["top_cause"]["key"] == "data_preparation"
    rung = m["oom"]["ladder"][0]
    assert rung["kind"] == "data-preparation" and f"{script}:" in rung["action"]
    assert m["oom"]["plan_error"] is None  # no "the script never called a model" noise
    assert (
        _run_fixed(tmp_path, script, "96MiB", code=("dtype=torch.float64", "dtype=torch.float32")) is not None
    )


@pytest.mark.slow
def test_optimizer_rung_predicts_the_sgd_momentum_peak(tmp_path: Path) -> None:
    script = HELD / "embedding_adam.py"
    m = _memory(tmp_path, script, "48MiB")
    assert m["top_cause"]["key"] == "optimizer_state"
    rung = next(r for r in m["oom"]["ladder"] if r["kind"] == "optimizer")
    assert rung["fits"]
    measured = _run_fixed(
        tmp_path,
        script,
        "48MiB",
        code=(
            "torch.optim.Adam(model.parameters(), lr=1e-2)",
            "torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)",
        ),
    )
    assert measured is not None and abs(measured - rung["peak"]) <= 0.10 * measured


@pytest.mark.slow
def test_notebook_driver_in_process_on_two_heldout_scripts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A notebook runs the script's cells in its own process: here each script's code, run by runpy in this one.
    monkeypatch.setattr(sys, "argv", ["retry_smaller_batch.py"])
    with torchscalpel.memory(steps=None, memory_limit="20MiB", out=tmp_path / "retry", report=False) as run:
        runpy.run_path(str(HELD / "retry_smaller_batch.py"), run_name="__main__")
    m = run.record.sections["memory"]
    # accelerate's retry catches exceptions to halve the batch; the limit is a BaseException, so the first
    # attempt's request is the one explained (batch 2048), not a later attempt's
    assert run.record.status == "failed" and m["top_cause"]["key"] == "activations"
    assert m["oom"]["plan"]["batch"] == 2048
    assert any(r["kind"] == "micro-batches" and r["fits"] for r in m["oom"]["ladder"])
    monkeypatch.setattr(sys, "argv", ["epoch_outputs_kept.py"])
    with torchscalpel.memory(steps=None, memory_limit="48MiB", out=tmp_path / "kept", report=False) as run:
        runpy.run_path(str(HELD / "epoch_outputs_kept.py"), run_name="__main__")
    m = run.record.sections["memory"]
    assert m["top_cause"]["key"] == "growth" and m["growth"]["kept"]["activations"] > 0
    assert m["oom"]["ladder"][0]["kind"] == "detach-kept"


def test_an_evaluation_forward_before_training_is_not_data_preparation(tmp_path: Path) -> None:
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def evaluate_then_train(eval_batch: int) -> None:
        with torch.no_grad():  # eval first, as nanoGPT's estimate_loss at iteration 0
            model(torch.randn(eval_batch, 256))
        for _ in range(2):
            loss = model(torch.randn(64, 256)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    with torchscalpel.memory(steps=None, memory_limit="8MiB", out=tmp_path / "eval", report=False) as run:
        evaluate_then_train(4096)  # 4096 x 2048 floats: 32 MiB in the evaluation forward
    m = run.record.sections["memory"]
    assert m["oom"]["request"]["phase"] == "evaluation" and m["top_cause"]["key"] != "data_preparation"
    with torchscalpel.memory(steps=None, memory_limit="8MiB", out=tmp_path / "prep", report=False) as run:
        _data = torch.randn(4096, 1024)  # a dataset built as one tensor before training: 16 MiB (stops here)
        evaluate_then_train(8)
    m = run.record.sections["memory"]
    assert m["oom"]["request"]["phase"] == "before training" and m["top_cause"]["key"] == "data_preparation"


@pytest.mark.slow
def test_under_a_limit_the_run_goes_on_until_slow_growth_crosses_it(tmp_path: Path) -> None:
    # Found: `scalpel memory --memory-limit 12MiB -- feature_cache.py` stopped at the default 20 steps, 4 steps
    # short of the limit: exit 0, no post-mortem, no ladder. A limit now means "until it ends or runs out".
    script = HELD / "feature_cache.py"
    js = tmp_path / "m.json"
    proc = run_cli(
        "memory",
        "--memory-limit",
        "12MiB",
        "--no-report",
        "--out",
        str(tmp_path / "run"),
        "--json",
        str(js),
        "--",
        str(script),
        OMP_NUM_THREADS="1",
    )
    m = json.loads(js.read_text())
    assert proc.returncode == 1 and m["oom"]["request"]["step"] > 21, proc.stdout[-1500:]
    assert m["top_cause"]["key"] == "growth"
    assert m["growth"]["sites"][0]["site"].startswith(f"{script}:")
    assert m["oom"]["ladder"][0]["kind"] == "stop-growth"
    fixed = (
        "    if missing:\n",
        "    if len(feature_cache) > 1024:\n        feature_cache.clear()\n    if missing:\n",
    )
    assert _run_fixed(tmp_path, script, "12MiB", code=fixed) is not None


@pytest.mark.slow
def test_a_bare_except_retry_that_swallows_the_stop_still_fails_the_limit(tmp_path: Path) -> None:
    # Found: a bare `except:` caught the limit's stop, the script halved its batch and finished: exit 0, and
    # `scalpel run` printed "peak live tensors 27.1 MiB under the limit 12.0 MiB".
    script = HELD / "bare_except_retry.py"
    js = tmp_path / "m.json"
    proc = run_cli(
        "memory",
        "--memory-limit",
        "12MiB",
        "--no-report",
        "--no-plan",
        "--out",
        str(tmp_path / "run"),
        "--json",
        str(js),
        "--",
        str(script),
        OMP_NUM_THREADS="1",
    )
    m = json.loads(js.read_text())
    assert proc.returncode == 1 and m["oom"]["caught_by_script"] and "caught the stop" in proc.stderr
    assert m["top_cause"]["key"] == "activations" and "note" in m["top_cause"]
    assert m["oom"]["request"]["bytes"] == 4096 * 1024 * 4  # the first attempt's request, not a retry's
    (tmp_path / "none.toml").write_text("[tune]\n")
    ran = run_cli(
        "run",
        "--memory-limit",
        "12MiB",
        "--config",
        str(tmp_path / "none.toml"),
        "--",
        str(script),
        OMP_NUM_THREADS="1",
    )
    assert (
        ran.returncode == 1
        and "the script caught the stop" in ran.stderr
        and "under the limit" not in ran.stderr
    )


def test_graphs_kept_from_earlier_steps_are_growth_before_a_slope_can_be_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found: the limit was crossed at step 2, too few step ends for a growth slope, so "activations" was named and
    # checkpointing offered as the fix (it would only move the out-of-memory a step later).
    monkeypatch.setattr(sys, "argv", ["fast_growth_eval.py"])
    with torchscalpel.memory(steps=None, memory_limit="56MiB", out=tmp_path / "run", report=False) as run:
        runpy.run_path(str(HELD / "fast_growth_eval.py"), run_name="__main__")
    m = run.record.sections["memory"]
    assert m["oom"]["request"]["step"] <= 3 and not m["growth"]["per_step"]
    assert m["top_cause"]["key"] == "growth" and m["oom"]["kept_activations"] >= 16 * 2**20
    import torchscalpel.report.memory_terminal as memory_terminal
    from torchscalpel.sections import MemorySection

    assert any(
        "saved in earlier steps were still live" in line
        for line in memory_terminal.render(MemorySection.from_dict(m))
    )
    first = m["oom"]["ladder"][0]
    assert first["kind"] == "detach-kept" and first["saves"] >= 16 * 2**20
    assert not any(r["kind"] == "checkpoint-blocks" for r in m["oom"]["ladder"])


@pytest.mark.slow
def test_an_optimizer_local_to_main_is_priced_when_the_first_forward_runs_out(tmp_path: Path) -> None:
    # Found: the plan priced "optimizer none" (the optimizer was gone with main()'s frame by the run's end, and no
    # backward had run), predicting 29.0 MiB for 8 micro-batches under 32 MiB; scalpel run then crossed the limit
    # in AdamW's first step. Parameters, gradients and AdamW state alone are 48 MiB here.
    m = _memory(tmp_path, HELD / "amp_main_workers.py", "40MiB")
    plan = m["oom"]["plan"]
    assert (
        m["oom"]["request"]["step"] == 0
        and plan["optimizer"] == "AdamW"
        and plan["precision"] == "bf16-mixed"
    )
    assert plan["optimizer_state"] >= 2 * 12 * 2**20
    assert not any(r["fits"] and r["config"] for r in m["oom"]["ladder"])  # no [tune] rung alone fits
    assert any(r["kind"] == "optimizer" for r in m["oom"]["ladder"])


@pytest.mark.slow
def test_a_first_backward_out_of_memory_is_not_growth(tmp_path: Path) -> None:
    # Found while adding growth-at-the-OOM: before the first optimizer step a forward ends a provisional step, so the
    # first forward's activations read as "from an earlier step" in the first backward: 65 MiB "kept", growth named.
    m = _memory(
        tmp_path, REPO / "tests" / "fixtures" / "memory" / "deep_transformer.py", "74MiB", "--no-plan"
    )
    assert m["oom"]["request"]["phase"] == "backward" and m["oom"]["kept_activations"] == 0
    assert m["top_cause"]["key"] == "activations"


@pytest.mark.slow
def test_a_backward_of_recomputed_blocks_is_named_activations_and_micro_batches_fit(tmp_path: Path) -> None:
    # Found: GPT-2 with gradient_checkpointing_enable() ran out in backward with 81% temporaries (recomputed
    # activations and their gradients) and "temporaries" was named: not a cause a user can act on.
    script = HELD / "hf_gpt2_grad_ckpt.py"
    m = _memory(tmp_path, script, "40MiB")
    assert m["oom"]["request"]["phase"] == "backward" and m["top_cause"]["key"] == "activations"
    assert "temporaries of the training backward" in m["top_cause"]["note"]
    first = m["oom"]["ladder"][0]
    assert first["kind"] == "micro-batches" and first["fits"]
    assert _run_fixed(tmp_path, script, "40MiB", first["config"]) is not None

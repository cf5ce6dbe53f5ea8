"""The search logic with a fake trial runner: greedy combination, gate, confirmation, failures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from torchscalpel.errors import ScalpelError
from torchscalpel.runtime.target import Target
from torchscalpel.tune import search as search_mod
from torchscalpel.tune.runner import TrialResult
from torchscalpel.tune.search import TuneOptions, parse_knobs, tune
from torchscalpel.tune.settings import TuneSettings
from torchscalpel.tune.states import TrialStatus, Verdict

LOSSES = [4.0, 3.6, 3.3, 3.1, 3.0]
FACTS = {"device": "cpu", "bf16_supported": True, "models": ["Net"], "loaders": 1, "cpu_count": 2,
         "torch_threads": 1, "optimizers": ["AdamW"], "repeated": [{"cls": "Block", "count": 2, "params": 10}]}


class FakeRunner:
    """Trial outcomes by settings label: median ms (or an exception-like status) and loss scale."""

    def __init__(self, medians: dict[str, float], *, loss_scale: dict[str, float] | None = None,
                 status: dict[str, tuple[str, str]] | None = None, confirm: dict[str, Any] | None = None,
                 baseline_fails: bool = False) -> None:
        self.medians = medians
        self.loss_scale = loss_scale or {}
        self.status = status or {}
        self.confirm = confirm or {}
        self.baseline_fails = baseline_fails
        self.calls: list[str] = []

    def __call__(self, target, settings: TuneSettings, out_dir: Path, **kw) -> TrialResult:
        label = settings.label()
        self.calls.append(f"{out_dir.name}:{label}")
        result = TrialResult(label=label, settings=settings.to_dict(), family=kw.get("family", "x"),
                             out_dir=str(out_dir), wall_s=1.0)
        if label == "baseline" and self.baseline_fails:
            result.status, result.cause = TrialStatus.FAILED, "crashed: RuntimeError: no data"
            return result
        if label in self.status:
            status, result.cause = self.status[label]
            result.status = TrialStatus(status)
            return result
        median = self.medians.get(label, 100.0)
        if "baseline-refresh" in out_dir.name:
            median = self.medians.get("refresh", median)
        if "confirm-" in out_dir.name and "baseline" not in out_dir.name and label in self.confirm:
            value = self.confirm[label]
            median = value.pop(0) if isinstance(value, list) else value
        result.median_ms = median
        result.step_ms = [median] * 5
        scale = self.loss_scale.get(label, 1.0)
        result.losses = [v * scale for v in LOSSES]
        if kw.get("facts"):
            result.facts = dict(FACTS)
        if label != "baseline":
            result.apply = {"fired": ["x"], "applied": ["x"], "skipped": []}
        return result


@pytest.fixture()
def run_search(monkeypatch, tmp_path):
    def go(runner: FakeRunner, **opts):
        monkeypatch.setattr(search_mod, "run_trial", runner)
        options = TuneOptions(out_dir=tmp_path / "out", budget_s=opts.pop("budget_s", 600), steps=3, warmup=1,
                              compile_backend="aot_eager", **opts)
        return tune(Target(script=Path("train.py")), options)

    return go


def test_greedy_combines_winners_and_confirms(run_search):
    runner = FakeRunner({"amp=bf16": 70.0, "threads=2": 90.0, "amp=bf16 + threads=2": 60.0,
                         "compile(Block)": 99.0, "compile(model)": 150.0},
                        loss_scale={"amp=bf16": 1.01, "amp=bf16 + threads=2": 1.01})
    result = run_search(runner)
    assert result.winner is not None and result.winner.label == "amp=bf16 + threads=2"
    assert result.settings == TuneSettings(amp="bf16", threads=2)
    assert result.confirmed_speedup == pytest.approx(100 / 60)
    verdicts = {t.label: t.verdict for t in result.trials}
    assert verdicts["compile(Block)"] == "not faster" and verdicts["compile(model)"] == "not faster"
    assert verdicts["amp=bf16"] == "faster"
    assert any("confirm-baseline" in c for c in runner.calls)
    # skipped knobs carry their reason
    skipped = {t.family: t.cause for t in result.trials if t.verdict == "skipped"}
    assert "no Conv2d" in skipped["channels_last"]


def test_combination_that_is_not_faster_is_dropped(run_search):
    runner = FakeRunner({"amp=bf16": 70.0, "threads=2": 90.0, "amp=bf16 + threads=2": 69.0})
    result = run_search(runner, knobs=("amp", "threads"))
    assert result.winner is not None and result.winner.label == "amp=bf16"
    combined = next(t for t in result.trials if t.family == "combined")
    assert combined.verdict == "not faster" and "did not beat" in combined.note


def test_numerics_failure_is_never_recommended(run_search):
    runner = FakeRunner({"amp=bf16": 50.0}, loss_scale={"amp=bf16": 1.2})
    result = run_search(runner, knobs=("amp",))
    assert result.winner is None and result.settings.is_baseline()
    amp = next(t for t in result.trials if t.label == "amp=bf16")
    assert amp.verdict == "numerics" and "tolerance" in amp.note


def test_exact_knob_held_to_tight_tolerance(run_search):
    runner = FakeRunner({"threads=2": 50.0}, loss_scale={"threads=2": 1.01})
    result = run_search(runner, knobs=("threads",))
    assert result.winner is None
    assert next(t for t in result.trials if t.label == "threads=2").verdict == "numerics"


def test_slower_candidates_leave_the_baseline(run_search):
    runner = FakeRunner({"amp=bf16": 120.0, "threads=2": 101.0})
    result = run_search(runner, knobs=("amp", "threads"))
    assert result.winner is None and result.settings.is_baseline()
    assert not any("confirm" in c for c in runner.calls)


def test_confirmation_rejects_a_lucky_screening(run_search):
    runner = FakeRunner({"amp=bf16": 70.0}, confirm={"amp=bf16": 99.0})
    result = run_search(runner, knobs=("amp",))
    assert result.winner is None
    assert result.confirmed_speedup == pytest.approx(100 / 99)
    assert any("not recommended" in n for n in result.notes)


def test_failures_and_timeouts_are_reported_and_search_goes_on(run_search):
    runner = FakeRunner({"threads=2": 80.0},
                        status={"amp=bf16": ("failed", "out of memory: RuntimeError: ..."),
                                "compile(Block)": ("timeout", "stopped after 30 s, its share of the budget"),
                                "compile(model)": ("not applied", "compile: no submodule")})
    result = run_search(runner)
    verdicts = {t.label: (t.verdict, t.cause) for t in result.trials}
    assert verdicts["amp=bf16"] == ("failed", "out of memory: RuntimeError: ...")
    assert verdicts["compile(Block)"][0] == "timeout"
    assert verdicts["compile(model)"][0] == Verdict.NOT_APPLIED == "not applied"
    assert result.winner is not None and result.winner.label == "threads=2"


def test_baseline_failure_is_a_clear_error(run_search):
    with pytest.raises(ScalpelError, match=r"baseline run failed .*no data"):
        run_search(FakeRunner({}, baseline_fails=True))


def test_budget_exhaustion_marks_trials_not_run(run_search, monkeypatch):
    clock = iter(range(0, 10_000, 50))  # every look at the clock costs 50 s
    monkeypatch.setattr(search_mod.time, "monotonic", lambda: float(next(clock)))
    result = run_search(FakeRunner({"amp=bf16": 50.0}), budget_s=200)
    assert any(t.verdict == "not run" and "budget" in t.cause for t in result.trials)


def test_parse_knobs():
    assert parse_knobs("amp, compile") == ("amp", "compile")
    with pytest.raises(Exception, match="Unknown knob turbo"):
        parse_knobs("amp,turbo")


def test_result_json_has_table_and_code(run_search):
    result = run_search(FakeRunner({"amp=bf16": 60.0}), knobs=("amp",))
    data = result.to_dict()
    assert data["settings"] == {"amp": "bf16"} and data["winner"]["verdict"] == "winner"
    assert any("autocast" in line for line in data["code_lines"])
    assert result.ranked()[0].label == "amp=bf16"


def test_memory_growth_is_noted(run_search, monkeypatch):
    runner = FakeRunner({"amp=bf16 + amp_fp32_attention": 120.0})
    original = runner.__call__

    def with_memory(target, settings, out_dir, **kw):
        result = original(target, settings, out_dir, **kw)
        result.peak_bytes = 100 if settings.is_baseline() else 200
        return result

    result = run_search(with_memory, knobs=("amp",))
    trial = next(t for t in result.trials if t.label == "amp=bf16 + amp_fp32_attention")
    assert trial.note == "peak memory 2.00x the baseline's"


def test_one_lucky_pair_cannot_carry_a_recommendation(run_search):
    runner = FakeRunner({"amp=bf16": 70.0}, confirm={"amp=bf16": [50.0, 99.0, 50.0]})
    result = run_search(runner, knobs=("amp",))
    amp = next(t for t in result.trials if t.label == "amp=bf16")
    assert result.winner is None and amp.verdict == "not confirmed"
    assert amp.confirm_ratios == [2.0, 1.01] and "every pair above 1.03x" in amp.note  # stopped at the losing pair


def test_falls_back_to_next_winner_when_best_is_not_confirmed(run_search):
    runner = FakeRunner({"amp=bf16": 70.0, "threads=2": 80.0, "amp=bf16 + threads=2": 50.0},
                        confirm={"amp=bf16 + threads=2": 100.0, "amp=bf16": 70.0})
    result = run_search(runner, knobs=("amp", "threads"))
    assert result.winner is not None and result.winner.label == "amp=bf16"
    combo = next(t for t in result.trials if t.label == "amp=bf16 + threads=2")
    assert combo.verdict == "not confirmed"
    assert result.confirmed_speedup == pytest.approx(100 / 70)


def test_interrupt_after_baseline_keeps_what_was_measured(run_search):
    runner = FakeRunner({"amp=bf16": 70.0})
    original = runner.__call__

    def interrupting(target, settings, out_dir, **kw):
        if settings.label() == "threads=2":
            raise KeyboardInterrupt
        return original(target, settings, out_dir, **kw)

    result = run_search(interrupting, knobs=("amp", "threads"))
    assert result.interrupted and result.winner is None
    assert any(t.label == "amp=bf16" and t.verdict == "faster" for t in result.trials)
    assert result.to_dict()["interrupted"] is True


def test_screening_compares_with_the_latest_baseline(run_search):
    # The machine slows down after the first trials: the refreshed baseline takes 200 ms.
    runner = FakeRunner({"refresh": 200.0, "amp=bf16 + amp_fp32_attention": 210.0, "amp=bf16": 150.0,
                         "threads=2": 150.0}, confirm={"threads=2": 50.0, "amp=bf16": 50.0})
    result = run_search(runner, knobs=("amp", "threads"))
    assert any("baseline-refresh" in c for c in runner.calls)
    threads = next(t for t in result.trials if t.label == "threads=2")
    assert threads.speedup == pytest.approx(200 / 150) and threads.verdict in ("faster", "winner")
    assert result.to_dict()["baseline_refs"] == [200.0]


def test_compile_block_trial_not_run_when_no_block_was_called(run_search, monkeypatch):
    facts = dict(FACTS, repeated=[], uncalled_blocks=["Block"])
    monkeypatch.setattr(sys.modules[__name__], "FACTS", facts)
    runner = FakeRunner({"compile(Block)": 61.0})  # a no-op that drift could screen as 1.64x
    result = run_search(runner, knobs=("compile",))
    assert not any("compile(Block)" in c for c in runner.calls)
    row = next(t for t in result.trials if t.label == "compile(blocks)")
    assert row.verdict == "skipped" and "never called in the forward" in row.cause
    assert any(c.endswith(":compile(model)") for c in runner.calls)

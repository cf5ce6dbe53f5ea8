"""The search logic with a fake trial runner: greedy combination, gate, confirmation, failures."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

from torchscalpel.errors import ScalpelError
from torchscalpel.runtime.target import Target
from torchscalpel.sections import TuneSection
from torchscalpel.tune import budget as budget_mod
from torchscalpel.tune import search as search_mod
from torchscalpel.tune.runner import TrialResult
from torchscalpel.tune.search import TuneOptions, parse_knobs, tune
from torchscalpel.tune.settings import TuneSettings
from torchscalpel.tune.states import TrialStatus, Verdict

LOSSES = [4.0, 3.6, 3.3, 3.1, 3.0]
FACTS = {
    "device": "cpu",
    "bf16_supported": True,
    "models": ["Net"],
    "loaders": 1,
    "cpu_count": 2,
    "torch_threads": 1,
    "optimizers": ["AdamW"],
    "repeated": [{"cls": "Block", "count": 2, "params": 10}],
}


class FakeRunner:
    """Trial outcomes by settings label: median ms (or an exception-like status) and loss scale."""

    def __init__(
        self,
        medians: dict[str, float],
        *,
        loss_scale: dict[str, float] | None = None,
        status: dict[str, tuple[str, str]] | None = None,
        confirm: dict[str, Any] | None = None,
        baseline_fails: bool = False,
    ) -> None:
        self.medians = medians
        self.loss_scale = loss_scale or {}
        self.status = status or {}
        self.confirm = confirm or {}
        self.baseline_fails = baseline_fails
        self.calls: list[str] = []

    def __call__(self, target, settings: TuneSettings, out_dir: Path, **kw) -> TrialResult:
        label = settings.label()
        self.calls.append(f"{out_dir.name}:{label}")
        result = TrialResult(
            label=label,
            settings=settings.to_dict(),
            family=kw.get("family", "x"),
            out_dir=str(out_dir),
            wall_s=1.0,
        )
        if label == "baseline" and self.baseline_fails:
            result.status, result.cause = TrialStatus.FAILED, "crashed: RuntimeError: no data"
            return result
        if label in self.status:
            status, result.cause = self.status[label]
            result.status = TrialStatus(status)
            return result
        median = self.medians.get(label, 100.0)
        if "baseline-refresh" in out_dir.name or "baseline-again" in out_dir.name:
            refresh = self.medians.get("refresh", median)
            median = refresh.pop(0) if isinstance(refresh, list) else refresh
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
        options = TuneOptions(
            out_dir=tmp_path / "out",
            budget_s=opts.pop("budget_s", 600),
            steps=3,
            warmup=1,
            compile_backend="aot_eager",
            **opts,
        )
        return tune(Target(script=Path("train.py")), options)

    return go


def test_greedy_combines_winners_and_confirms(run_search):
    runner = FakeRunner(
        {
            "amp=bf16": 70.0,
            "threads=2": 90.0,
            "amp=bf16 + threads=2": 60.0,
            "compile(Block)": 99.0,
            "compile(model)": 150.0,
        },
        loss_scale={"amp=bf16": 1.01, "amp=bf16 + threads=2": 1.01},
    )
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
    assert result.winner is None and result.confirmed_speedup is None
    (amp,) = [t for t in result.trials if t.label == "amp=bf16"]
    # its one speedup is now the confirmation's (the screening said 100/70 = 1.43x), everywhere
    assert amp.verdict == "not confirmed" and amp.speedup == pytest.approx(100 / 99)
    assert amp.speedup_pair == [100.0, 99.0]
    assert any("not recommended" in n and "(speedup 1.01x)" in n for n in result.notes)


def test_failures_and_timeouts_are_reported_and_search_goes_on(run_search):
    runner = FakeRunner(
        {"threads=2": 80.0},
        status={
            "amp=bf16": ("failed", "out of memory: RuntimeError: ..."),
            "compile(Block)": ("timeout", "stopped after 30 s, its share of the budget"),
            "compile(model)": ("not applied", "compile: no submodule"),
        },
    )
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
    monkeypatch.setattr(budget_mod.time, "monotonic", lambda: float(next(clock)))
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
    assert (
        amp.confirm_ratios == [2.0, 1.01] and "every pair above 1.03x" in amp.note
    )  # stopped at the losing pair


def test_falls_back_to_next_winner_when_best_is_not_confirmed(run_search):
    runner = FakeRunner(
        {"amp=bf16": 70.0, "threads=2": 80.0, "amp=bf16 + threads=2": 50.0},
        confirm={"amp=bf16 + threads=2": 100.0, "amp=bf16": 70.0},
    )
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
    runner = FakeRunner(
        {"refresh": 200.0, "amp=bf16 + amp_fp32_attention": 210.0, "amp=bf16": 150.0, "threads=2": 150.0},
        confirm={"threads=2": 50.0, "amp=bf16": 50.0},
    )
    result = run_search(runner, knobs=("amp", "threads"))
    assert any("baseline-refresh" in c for c in runner.calls)
    threads = next(t for t in result.trials if t.label == "threads=2")
    # screened against the refreshed baseline beside it; its speedup is then the confirmation's
    assert threads.baseline_ms == 200.0 and threads.median_ms == 150.0 and threads.verdict == "winner"
    assert threads.speedup == pytest.approx(100 / 50) == result.confirmed_speedup
    # 200 ms against 100 ms before it is measured again; the pace held, so the trial is judged against it
    assert result.to_dict()["baseline_refs"] == [200.0, 200.0]
    assert any("baseline-again" in c for c in runner.calls)


def test_one_slow_baseline_is_measured_again_before_a_trial_is_judged_against_it(run_search):
    # a moment of load: one re-measure at 160 ms between baselines of 100 ms
    runner = FakeRunner(
        {
            "refresh": [160.0, 100.0],
            "amp=bf16 + amp_fp32_attention": 100.0,
            "amp=bf16": 100.0,
            "threads=2": 85.0,
        },
        confirm={"threads=2": 85.0},
    )
    result = run_search(runner, knobs=("amp", "threads"))
    threads = next(t for t in result.trials if t.label == "threads=2")
    assert result.to_dict()["baseline_refs"][:2] == [160.0, 100.0]
    assert threads.baseline_ms == 100.0  # not 160: screened 1.18x, not 1.88x


def test_a_candidate_screened_above_the_confirmed_winner_is_confirmed_too(run_search):
    # amp screens 2.5x against a slow baseline beside it and confirms at 1.25x; the combination screened
    # 1.6x, set aside for not beating 2.5x, confirms at 1.6x: the answer is the better confirmed one
    runner = FakeRunner(
        {"amp=bf16": 40.0, "threads=2": 90.0, "amp=bf16 + threads=2": 62.5},
        confirm={"amp=bf16": 80.0, "amp=bf16 + threads=2": 62.5},
    )
    result = run_search(runner, knobs=("amp", "threads"))
    assert result.winner is not None and result.winner.label == "amp=bf16 + threads=2"
    assert result.confirmed_speedup == pytest.approx(1.6)
    amp = next(t for t in result.trials if t.label == "amp=bf16")
    assert amp.verdict == "not confirmed" and "confirmed higher" in amp.note


def test_compile_block_trial_not_run_when_no_block_was_called(run_search, monkeypatch):
    facts = dict(FACTS, repeated=[], uncalled_blocks=["Block"])
    monkeypatch.setattr(sys.modules[__name__], "FACTS", facts)
    runner = FakeRunner({"compile(Block)": 61.0})  # a no-op that drift could screen as 1.64x
    result = run_search(runner, knobs=("compile",))
    assert not any("compile(Block)" in c for c in runner.calls)
    row = next(t for t in result.trials if t.label == "compile(blocks)")
    assert row.verdict == "skipped" and "never called in the forward" in row.cause
    assert any(c.endswith(":compile(model)") for c in runner.calls)


# -- budget: no idle reserve, trial N of M, honest advice ----------------------------------------


class Clock:
    """A fake monotonic clock: each fake trial advances it by its wall time."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def timed(runner: FakeRunner, clock: Clock, wall: dict[str, float] | None = None, default: float = 10.0):
    def run(target, settings, out_dir, **kw):
        result = runner(target, settings, out_dir, **kw)
        result.wall_s = (wall or {}).get(settings.label(), default)
        clock.t += result.wall_s
        return result

    run.calls = runner.calls  # type: ignore[attr-defined]
    return run


class Recorder:
    def __init__(self) -> None:
        self.started: list[tuple[str, int, int, float]] = []
        self.messages: list[str] = []

    def message(self, text: str) -> None:
        self.messages.append(text)

    def trial_started(self, label, limit_s, *, index=0, total=0, left_s=0.0) -> None:
        self.started.append((label, index, total, left_s))

    def trial_finished(self, result) -> None:
        return None


@pytest.fixture()
def clocked(monkeypatch, tmp_path):
    clock = Clock()
    monkeypatch.setattr(budget_mod.time, "monotonic", clock)

    def go(runner: FakeRunner, *, budget_s: float, wall: dict[str, float] | None = None, **opts):
        monkeypatch.setattr(search_mod, "run_trial", timed(runner, clock, wall))
        progress = Recorder()
        options = TuneOptions(
            out_dir=tmp_path / "out",
            budget_s=budget_s,
            steps=3,
            warmup=1,
            compile_backend="aot_eager",
            **opts,
        )
        return search_mod.Search(Target(script=Path("train.py")), options, progress).run(), progress

    return go


def test_no_time_is_held_back_while_nothing_has_won(clocked):
    # Baseline runs take 10 s. The old search kept 7 x 10 s back from the first trial on, so with
    # 100 s and 20 s spent on the baseline no knob would have run at all.
    result, _ = clocked(FakeRunner({}), budget_s=100, knobs=("amp", "threads"))
    ran = [t for t in result.trials if t.verdict not in ("skipped",)]
    assert ran and all(t.verdict == "not faster" for t in ran)
    assert not any(t.verdict == "not run" for t in result.trials)


def test_a_winner_keeps_exactly_its_confirmation_time(clocked):
    runner = FakeRunner({"amp=bf16 + amp_fp32_attention": 60.0})
    result, _ = clocked(runner, budget_s=80, knobs=("amp", "threads"), confirm_pairs=2)
    # after the first trial won, 2 pairs x (10 + 10) s = 40 s are kept: the later trials are not run
    not_run = [t for t in result.trials if t.verdict == "not run"]
    assert not_run and "kept to confirm" in not_run[0].cause
    assert result.winner is not None and result.winner.label == "amp=bf16 + amp_fp32_attention"
    assert result.winner.confirm_pairs == [[100.0, 60.0], [100.0, 60.0]]


def test_too_small_a_budget_says_what_budget_would_confirm(clocked):
    runner = FakeRunner({"amp=bf16": 60.0})
    result, _ = clocked(
        runner, budget_s=42, knobs=("amp",), wall={"amp=bf16 + amp_fp32_attention": 1.0, "amp=bf16": 11.0}
    )
    assert result.winner is None
    note = next(n for n in result.notes if "not confirmed" in n)
    assert "3 confirmation pair(s) need about 63 s (baseline 10 s + candidate 11 s each)" in note
    assert "--budget 120s would confirm it" in note  # 32 s spent + 63 s of pairs, to the half minute


def test_progress_counts_trial_n_of_m_with_time_left(clocked):
    _, progress = clocked(FakeRunner({"threads=2": 60.0}), budget_s=600, knobs=("amp", "threads"))
    indices = [i for _, i, _, _ in progress.started]
    assert indices == list(range(1, len(indices) + 1))
    assert all(0 < i <= total for _, i, total, _ in progress.started)
    lefts = [left for *_, left in progress.started]
    assert lefts == sorted(lefts, reverse=True) and lefts[0] == pytest.approx(600)
    assert progress.started[-1][1] == progress.started[-1][2]  # the plan ends where the search ends
    assert any(m.startswith("profile: ") for m in progress.messages)


def test_each_row_shows_the_baseline_its_ratio_used(run_search):
    from torchscalpel.report.tune_terminal import HEADERS, row_cells

    runner = FakeRunner(
        {"refresh": 200.0, "amp=bf16 + amp_fp32_attention": 210.0, "amp=bf16": 150.0, "threads=2": 150.0},
        confirm={"threads=2": 50.0, "amp=bf16": 50.0},
    )
    result = run_search(runner, knobs=("amp", "threads"))
    cells = dict(
        zip(HEADERS, row_cells(next(t for t in result.trials if t.label == "threads=2")), strict=True)
    )
    # confirmed: the row shows the confirmation pair its speedup is the ratio of, and the screening beside it
    assert cells["vs baseline ms"] == "100.0" and cells["step ms"] == "50.0" and cells["speedup"] == "2.00x"
    assert cells["spread"] == "2.00-2.00x over 3 pairs"
    assert "screened 1.33x (200.0 / 150.0 ms) before confirmation" in cells["result"]
    amp = dict(zip(HEADERS, row_cells(next(t for t in result.trials if t.label == "amp=bf16")), strict=True))
    assert amp["vs baseline ms"] == "100.0" and amp["step ms"] == "150.0" and amp["speedup"] == "0.67x"
    assert amp["spread"] == "not measured: one run"
    first = dict(
        zip(
            HEADERS,
            row_cells(next(t for t in result.trials if t.label.startswith("amp=bf16 +"))),
            strict=True,
        )
    )
    assert first["vs baseline ms"] == "100.0"  # measured before the refresh: against the first baseline
    base = dict(zip(HEADERS, row_cells(result.baseline), strict=True))
    assert base["vs baseline ms"] == base["step ms"] == "100.0" and base["speedup"] == "1.00x"


def test_a_refresh_that_would_leave_the_trial_no_time_is_not_run(clocked):
    # The first trial wins: 3 pairs x 20 s = 60 s are kept. Before the third trial a baseline
    # refresh is due; with 75 s left, refresh (10 s) + the kept 60 s leave 5 s: neither runs
    # (running the refresh anyway left the trial 15 s and it timed out, seen on char_transformer).
    runner = FakeRunner({"amp=bf16 + amp_fp32_attention": 60.0})
    result, _ = clocked(runner, budget_s=115, knobs=("amp", "threads"))
    assert not any("baseline-refresh" in c for c in runner.calls)
    (not_run,) = [t for t in result.trials if t.verdict == "not run"]
    assert not_run.label == "threads=2" and "kept to confirm" in not_run.cause
    assert result.winner is not None and len(result.winner.confirm_ratios) == 3


# -- near-ties stacked on the winner; measured steps from a minimum measured time ----------------


def test_near_tie_is_stacked_on_the_winner(run_search):
    # fused alone is 1.01x (below the 3 % margin); on top of bf16 it is worth a trial.
    runner = FakeRunner({"amp=bf16": 70.0, "optimizer=fused": 99.0, "amp=bf16 + optimizer=fused": 66.0})
    result = run_search(runner, knobs=("amp", "optimizer"))
    fused = next(t for t in result.trials if t.label == "optimizer=fused")
    assert fused.verdict == "not faster"
    assert result.winner is not None and result.winner.label == "amp=bf16 + optimizer=fused"
    assert (
        "near-tie optimizer=fused" in result.winner.reason
        and result.winner.reason_short == "winner + near-tie"
    )


def test_near_tie_that_does_not_help_the_winner_is_dropped(run_search):
    runner = FakeRunner({"amp=bf16": 70.0, "optimizer=fused": 99.0, "amp=bf16 + optimizer=fused": 72.0})
    result = run_search(runner, knobs=("amp", "optimizer"))
    combined = next(t for t in result.trials if t.label == "amp=bf16 + optimizer=fused")
    assert combined.verdict == "not faster" and "did not match its ratio" in combined.note
    assert result.winner is not None and result.winner.label == "amp=bf16"


def test_slower_or_expensive_knobs_are_not_stacked(run_search):
    runner = FakeRunner(
        {"amp=bf16": 70.0, "optimizer=fused": 103.0, "compile(Block)": 99.0, "compile(model)": 99.5}
    )
    result = run_search(runner, knobs=("amp", "optimizer", "compile"))
    assert not any(t.family == "combined" for t in result.trials)
    assert result.winner is not None and result.winner.label == "amp=bf16"


def test_no_near_tie_without_a_winner(run_search):
    runner = FakeRunner({"optimizer=fused": 99.0})
    result = run_search(runner, knobs=("optimizer",))
    assert result.winner is None and not any(t.family == "combined" for t in result.trials)


def test_measured_steps_reach_the_minimum_measured_time():
    options = TuneOptions(out_dir=Path("x"), steps=10, min_measure_s=2.0)
    assert options.measured_steps(15.0) == 134  # ceil(2000 / 15)
    assert options.measured_steps(400.0) == 10  # never below --steps
    assert options.measured_steps(0.5) == 400  # capped
    assert TuneOptions(out_dir=Path("x"), steps=10).measured_steps(15.0) == 10  # 0: fixed steps
    with pytest.raises(ValueError, match="min_measure_s"):
        TuneOptions(out_dir=Path("x"), min_measure_s=-1)


def test_trials_after_the_first_baseline_measure_more_steps_when_steps_are_short(monkeypatch, tmp_path):
    steps: list[tuple[str, int]] = []
    runner = FakeRunner({"baseline": 20.0, "threads=2": 10.0})

    def recording(target, settings, out_dir, **kw):
        steps.append((out_dir.name, kw["steps"]))
        return runner(target, settings, out_dir, **kw)

    monkeypatch.setattr(search_mod, "run_trial", recording)
    options = TuneOptions(out_dir=tmp_path / "out", steps=3, warmup=1, knobs=("threads",), min_measure_s=1.0)
    result = tune(Target(script=Path("train.py")), options)
    assert steps[0] == ("01-baseline-facts", 3)
    assert {n for _, n in steps[1:]} == {50}  # 1 s / 20 ms, for the plain baseline and every trial after it
    assert result.measured_steps == 50 and result.to_dict()["measured_steps"] == 50


def test_the_plain_baseline_raises_the_step_count_when_the_facts_run_was_slowed(monkeypatch, tmp_path):
    steps: list[int] = []
    runner = FakeRunner({"baseline": 10.0})

    def recording(target, settings, out_dir, **kw):
        steps.append(kw["steps"])
        result = runner(target, settings, out_dir, **kw)
        if kw.get("facts"):  # submodule timing hooks make the facts run's steps twice as slow
            result.median_ms = 20.0
        return result

    monkeypatch.setattr(search_mod, "run_trial", recording)
    options = TuneOptions(out_dir=tmp_path / "out", steps=3, warmup=1, knobs=("threads",), min_measure_s=1.0)
    result = tune(Target(script=Path("train.py")), options)
    assert steps[:3] == [3, 50, 100]  # facts run, plain baseline (from 20 ms), then 1 s / 10 ms
    assert result.measured_steps == 100


def _refresh_positions(calls: list[str]) -> list[int]:
    # (a re-measure far off the earlier ones is measured again at once: that run is not a refresh)
    screening = [c for c in calls if "confirm" not in c and "combined" not in c and "baseline-again" not in c]
    return [i for i, c in enumerate(screening) if "baseline-refresh" in c]


def test_a_noisy_baseline_is_re_measured_before_every_trial(run_search):
    # Screening: amp (2 candidates), threads, optimizer. Quiet machine: one refresh every 2 trials.
    quiet = FakeRunner({"refresh": 100.0})
    run_search(quiet, knobs=("amp", "threads", "optimizer"))
    assert len(_refresh_positions(quiet.calls)) == 1
    # The first refresh differs from the baseline by 67 %: from then on one before every trial.
    noisy = FakeRunner({"refresh": 200.0})
    run_search(noisy, knobs=("amp", "threads", "optimizer"))
    positions = _refresh_positions(noisy.calls)
    assert len(positions) >= 2 and all(
        b - a == 2 for a, b in itertools.pairwise(positions)
    )  # refresh, trial, ...


def test_winners_are_ranked_by_their_ratio_not_raw_step_time():
    from torchscalpel.tune.ordering import confirm_queue, winners

    def trial(label, family, ms, base):
        return TrialResult(
            label=label,
            settings={},
            family=family,
            median_ms=ms,
            baseline_ms=base,
            speedup=base / ms,
            verdict=Verdict.FASTER,
        )

    # Seen on char_transformer: screened minutes apart, against baselines of 312 and 325 ms.
    workers = trial("num_workers=1", "dataloader", 295.7, 312.2)
    amp = trial("amp=bf16", "amp", 295.8, 325.1)
    assert [t.label for t in winners([workers, amp])] == ["amp=bf16", "num_workers=1"]
    assert [t.label for t in confirm_queue(None, [], [workers, amp])] == ["amp=bf16", "num_workers=1"]


# -- issue 27: every number a user reads is right -------------------------------------------------


def limited(runner: FakeRunner, clock: Clock, wall: dict[str, float], default: float = 10.0):
    """Like :func:`timed`, but a trial whose wall time passes its limit is stopped there (a timeout)."""

    def run(target, settings, out_dir, **kw):
        label = settings.label()
        spent = wall.get("compile" if label.startswith("compile") else label, default)
        limit = kw["timeout_s"]
        if spent > limit:
            clock.t += limit
            return TrialResult(
                label=label,
                settings=settings.to_dict(),
                family=kw.get("family", "x"),
                status=TrialStatus.TIMEOUT,
                wall_s=limit,
                out_dir=str(out_dir),
                cause=f"stopped after {limit:.0f} s, its share of the budget",
            )
        result = runner(target, settings, out_dir, **kw)
        result.wall_s = spent
        clock.t += spent
        return result

    run.calls = runner.calls  # type: ignore[attr-defined]
    return run


def test_a_compile_trial_is_not_started_on_less_than_a_cold_compile_needs():
    # The budget arithmetic of pytorch/examples mnist under --budget 3m: baseline runs of 13 s, amp won
    # screening with a 23 s run, so 3 pairs x (13 + 23) s = 108 s are kept; 133 s were left. The compile
    # trial got the 25 s between (its limit), timed out, and every cheaper knob after it was "not run".
    budget = budget_mod.Budget(180.0, 3)
    budget.baseline_wall = 13.0
    amp = TrialResult(label="amp=bf16", settings={}, wall_s=23.0)
    keep = budget.confirm_s(amp)
    assert keep == 108.0
    budget.deadline = budget.start + 133.0 + budget.elapsed()
    compile_settings = TuneSettings.from_dict({"compile": {"target": "model"}})
    why = budget.cannot_run(compile_settings, keep, 0.0)
    assert why.startswith("a compile trial needs about 46 s"), why
    assert budget.cannot_run(TuneSettings(threads=2), keep, 0.0) == ""  # 25 s left: a 13 s knob fits


def test_mnist_budget_goes_to_the_cheap_knobs_not_to_a_compile_that_cannot_finish(monkeypatch, tmp_path):
    from torchscalpel.tune.bottleneck import Bottleneck

    clock = Clock()
    monkeypatch.setattr(budget_mod.time, "monotonic", clock)
    # mnist's profile: compute-bound, so amp and compile come before threads and the optimizer
    monkeypatch.setattr(
        search_mod,
        "classify_trial",
        lambda trial: Bottleneck(
            kind="compute", evidence={"compute": "matmul/conv/attention 58% of op time"}
        ),
    )
    monkeypatch.setattr(
        sys.modules[__name__], "FACTS", dict(FACTS, attention_calls=0)
    )  # a CNN: one amp trial
    runner = FakeRunner({"baseline": 182.0, "amp=bf16 + amp_fp32_attention": 171.6, "amp=bf16": 171.6})
    monkeypatch.setattr(
        search_mod,
        "run_trial",
        limited(
            runner,
            clock,
            {"baseline": 13.0, "amp=bf16 + amp_fp32_attention": 23.0, "amp=bf16": 23.0, "compile": 60.0},
        ),
    )
    options = TuneOptions(
        out_dir=tmp_path / "out",
        budget_s=180,
        steps=3,
        warmup=1,
        compile_backend="aot_eager",
        knobs=("amp", "compile", "threads", "optimizer"),
    )
    result = search_mod.Search(Target(script=Path("train.py")), options, Recorder()).run()
    rows = {t.label: t for t in result.trials}
    assert not any(t.verdict == "timeout" for t in rows.values()), {k: t.cause for k, t in rows.items()}
    compiles = [t for label, t in rows.items() if label.startswith("compile")]
    assert compiles and all(
        t.verdict == "not run" and "a compile trial needs about" in t.cause for t in compiles
    ), {t.label: t.cause for t in result.trials}
    cheap = [t for label, t in rows.items() if label.startswith(("threads", "optimizer"))]
    assert any(t.verdict not in ("not run", "skipped") for t in cheap), {t.label: t.cause for t in cheap}


def test_every_output_shows_one_speedup_per_candidate(monkeypatch, tmp_path):
    # Screening said 100/61 = 1.64x; the interleaved pairs said 1.32x, 1.25x and 1.40x. The table, the
    # recommendation, report.html, run.json and code.txt all show 1.32x (the old table showed 1.64x).
    import json
    import re

    from rich.console import Console

    import torchscalpel.report.tune_terminal as tune_terminal
    from torchscalpel.record import load_record
    from torchscalpel.report.tune_sections import build
    from torchscalpel.report.tune_terminal import HEADERS
    from torchscalpel.stages.tune import save_outputs

    label = "threads=2"
    runner = FakeRunner({label: 61.0}, confirm={label: [100 / 1.32, 100 / 1.25, 100 / 1.40]})
    monkeypatch.setattr(search_mod, "run_trial", runner)
    options = TuneOptions(out_dir=tmp_path / "out", budget_s=600, steps=3, warmup=1, knobs=("threads",))
    result = tune(Target(script=Path("train.py")), options)
    out = tmp_path / "out"
    save_outputs(result, out, config_path=None, command=["scalpel", "tune"], target_text="train.py")
    console = Console(record=True, width=400)
    tune_terminal.render(
        TuneSection.from_dict(result.to_dict()), out_dir=out, config_path=out / "scalpel.toml", out=console
    )
    text = console.export_text()
    row = next(line for line in text.splitlines() if line.startswith(f"│ {label}"))
    cells = [c.strip() for c in row.strip("│").split("│")]
    table = dict(zip(HEADERS, cells, strict=False))
    recommended = re.search(rf"recommended: {re.escape(label)}: (\d+\.\d\d)x faster", text).group(1)
    assert table["speedup"] == f"{recommended}x" == "1.32x"  # the old table said 1.64x (screening)
    tune_json = json.loads((out / "run.json").read_text())["sections"]["tune"]
    stored = next(t for t in tune_json["trials"] if t["label"] == label)
    code = re.search(r"(\d+\.\d\d)x faster", (out / "code.txt").read_text()).group(1)
    toml = re.search(r"(\d+\.\d\d)x faster", (out / "scalpel.toml").read_text()).group(1)
    body = build(load_record(out))[0].body
    html = re.search(r"<b>(\d+\.\d\d)x</b>faster per step", body).group(1)
    html_row = build(load_record(out))[1].body
    assert table["speedup"] == f"{recommended}x" == "1.32x"
    assert (
        recommended
        == code
        == toml
        == html
        == f"{stored['speedup']:.2f}"
        == f"{tune_json['confirmed_speedup']:.2f}"
    )
    assert f'<td class="num">{recommended}x</td>' in html_row or f">{recommended}x<" in html_row
    # the ratio equals the two step times shown beside it, in the table and in run.json
    base_ms, cand_ms = stored["speedup_pair"]
    assert stored["speedup"] == pytest.approx(base_ms / cand_ms)
    assert table["vs baseline ms"] == f"{base_ms:.1f}" and table["step ms"] == f"{cand_ms:.1f}"
    assert table["spread"] == "1.25-1.40x over 3 pairs" and stored["speedup_spread"] == [1.25, 1.4]
    assert "1.64x" in table["result"]  # the screening figure is kept, said as the screening's


def test_noise_is_over_every_baseline_run_even_without_a_confirmation(run_search):
    from torchscalpel.record import RunRecord
    from torchscalpel.report.tune_sections import build
    from torchscalpel.tune.verify import noise_fraction

    # 3570 and 2499 ms per step: the old search printed "baseline noise 0.0%" (set only by a confirmation)
    runner = FakeRunner(
        {
            "baseline": 3570.0,
            "refresh": 2499.0,
            "amp=bf16": 3600.0,
            "threads=2": 3600.0,
            "amp=bf16 + amp_fp32_attention": 3600.0,
        }
    )
    result = run_search(runner, knobs=("amp", "threads"))
    assert result.winner is None and not any("confirm" in c for c in runner.calls)
    # the re-measure 30% off the first is measured again (2499 once more): three baseline runs
    assert result.baseline_medians == [3570.0, 2499.0, 2499.0]
    assert result.noise == pytest.approx(noise_fraction([3570.0, 2499.0, 2499.0])) and result.noise > 0.15
    body = build(RunRecord(sections={"tune": result.to_dict()}))[0].body
    assert f"baseline noise {result.noise:.1%} over 3 baseline runs" in body


def test_noise_from_one_baseline_run_is_not_measured(run_search):
    from torchscalpel.record import RunRecord
    from torchscalpel.report.tune_sections import build

    result = run_search(FakeRunner({}), knobs=("threads",))
    body = build(RunRecord(sections={"tune": result.to_dict()}))[0].body
    assert "baseline noise not measured: 1 plain baseline run (it needs two)" in body  # was "0.0%"
    assert result.baseline_medians == [100.0] and result.noise is None


def test_a_search_that_measured_no_candidate_says_so_and_recommends_nothing(clocked, tmp_path):
    from rich.console import Console

    import torchscalpel.report.tune_terminal as tune_terminal

    # baseline runs of 10 s in a 25 s budget: nothing is left for any candidate
    result, _ = clocked(FakeRunner({"threads=2": 50.0}), budget_s=25, knobs=("amp", "threads"))
    assert result.winner is None and result.settings.is_baseline()
    assert all(t.verdict in ("not run", "skipped") for t in result.trials)
    console = Console(record=True, width=300)
    tune_terminal.render(
        TuneSection.from_dict(result.to_dict()),
        out_dir=tmp_path,
        config_path=tmp_path / "scalpel.toml",
        out=console,
    )
    text = console.export_text()
    assert "nothing beat the baseline" not in text  # what the demo said when every candidate was "not run"
    assert "no change recommended: no candidate was measured: the budget ran out after the baseline" in text
    assert "rerun with --budget " in result.no_candidate


class Events(Recorder):
    """Progress lines and trial starts in the order they were said."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, Any]] = []

    def message(self, text: str) -> None:
        super().message(text)
        self.events.append(("message", text))

    def trial_started(self, label, limit_s, *, index=0, total=0, left_s=0.0) -> None:
        super().trial_started(label, limit_s, index=index, total=total, left_s=left_s)
        self.events.append(("trial", (index, total)))


@pytest.mark.parametrize(
    "budget_s,medians",
    [
        (115, {"amp=bf16 + amp_fp32_attention": 60.0}),  # a winner, a refresh, a trial not run, confirmation
        (600, {"refresh": 160.0}),  # noisy baselines: a re-measure before every trial
        (600, {"amp=bf16": 70.0}),  # confirmation ruled out by its first pair
        (45, {}),  # the budget runs out after the baseline
    ],
)
def test_trial_n_of_m_is_consecutive_and_m_never_changes_silently(monkeypatch, tmp_path, budget_s, medians):
    clock = Clock()
    monkeypatch.setattr(budget_mod.time, "monotonic", clock)
    runner = FakeRunner(medians, confirm={"amp=bf16": 99.0})
    monkeypatch.setattr(search_mod, "run_trial", timed(runner, clock))
    progress = Events()
    options = TuneOptions(
        out_dir=tmp_path / "out",
        budget_s=budget_s,
        steps=3,
        warmup=1,
        compile_backend="aot_eager",
        knobs=("amp", "threads"),
    )
    search_mod.Search(Target(script=Path("train.py")), options, progress).run()
    starts = [v for kind, v in progress.events if kind == "trial"]
    assert [i for i, _ in starts] == list(range(1, len(starts) + 1))
    said = False
    last_total = None
    for kind, value in progress.events:
        if kind == "message" and value.startswith("plan: "):
            said = True
        elif kind == "trial":
            index, total = value
            assert index <= total
            assert last_total is None or total == last_total or said, progress.events
            last_total, said = total, False
    # the last trial shown is the last of the plan, or a line says the search ended earlier
    assert starts[-1][0] == starts[-1][1] or said, progress.events


def test_a_search_whose_every_trial_failed_says_no_candidate_was_measured(run_search):
    runner = FakeRunner(
        {},
        status={
            "amp=bf16": ("failed", "crashed: RuntimeError: boom"),
            "amp=bf16 + amp_fp32_attention": ("failed", "crashed: RuntimeError: boom"),
            "threads=2": ("timeout", "stopped after 30 s, its share of the budget"),
        },
    )
    result = run_search(runner, knobs=("amp", "threads"))
    assert result.winner is None
    assert result.no_candidate.startswith("no candidate was measured: every trial that ran failed, timed out")
    assert "threads=2: timeout" in result.no_candidate and result.headline().endswith(result.no_candidate)


# -- the budget spent on the answer (issue 39) ---------------------------------------------------------


def test_a_confirmation_the_budget_cut_short_recommends_nothing(clocked):
    # 10 s runs; the winner's confirmation buys fewer than the three pairs asked before the budget ends:
    # no recommendation (issue 39: bf16 + amp_fp32_attention recommended at 1.32x from one pair)
    runner = FakeRunner({"amp=bf16": 60.0})
    result, _ = clocked(runner, budget_s=71, knobs=("amp",), wall={"amp=bf16 + amp_fp32_attention": 1.0})
    trial = next(t for t in result.trials if t.label == "amp=bf16")
    bought = len(trial.confirm_pairs)
    assert 1 <= bought < 3 and all(c / b < 0.97 for b, c in trial.confirm_pairs)  # each pair a clear win
    assert result.winner is None and trial.verdict == Verdict.NOT_CONFIRMED
    assert f"in all 3 pairs (the budget bought {bought})" in trial.note
    assert any("one pair cannot carry it" in n and "--budget" in n for n in result.notes)


def test_the_best_screening_winner_is_confirmed_before_the_long_tail(run_search, monkeypatch):
    from torchscalpel.tune.bottleneck import Bottleneck

    monkeypatch.setattr(
        search_mod, "classify_trial", lambda trial: Bottleneck(kind="compute", evidence={"compute": "mm 60%"})
    )
    runner = FakeRunner({"amp=bf16": 60.0})
    result = run_search(runner, knobs=("amp", "optimizer"))
    order = [c.split(":", 1)[0].split("-", 1)[1] for c in runner.calls]
    first_confirm = order.index("confirm-1")
    tail = next(i for i, c in enumerate(runner.calls) if c.endswith(":optimizer=fused"))
    assert first_confirm < tail, runner.calls  # the answer first, then the knobs the profile does not name
    assert result.winner is not None and result.winner.label.startswith("amp=bf16")
    # confirmed once, not again at the end
    assert sum(1 for c in runner.calls if c.split(":", 1)[0].endswith("confirm-1")) == 1


def test_one_pair_far_below_screening_gets_a_second_pair_before_a_verdict(run_search):
    # screened 100/60 = 1.67x; pair 1 says 0.33x: one more pair decides, the row never shows one bad pair
    runner = FakeRunner({"amp=bf16": 60.0}, confirm={"amp=bf16": [300.0, 60.0, 60.0]})
    result = run_search(runner, knobs=("amp",))
    trial = next(t for t in result.trials if t.label == "amp=bf16")
    assert len(trial.confirm_pairs) >= 2
    assert any("one more pair decides" in n for n in result.notes)
    assert result.winner is None  # every pair must still show it faster


def test_a_confirmation_run_that_compiled_during_timing_is_run_again_not_averaged(run_search):
    class Recompiling(FakeRunner):
        def __call__(self, target, settings, out_dir, **kw):
            result = super().__call__(target, settings, out_dir, **kw)
            if out_dir.name.endswith("confirm-1"):
                result.status = TrialStatus.FAILED
                result.median_ms = None
                result.steady_note = result.cause = (
                    "not measured: dynamo compiled during 5 of 5 measured step(s)"
                )
            return result

    runner = Recompiling({"amp=bf16": 60.0})
    result = run_search(runner, knobs=("amp",))
    assert any(c.split(":", 1)[0].endswith("confirm-1-rerun") for c in runner.calls), runner.calls
    assert result.winner is not None and len(result.winner.confirm_pairs) == 3
    assert any("re-run: not measured: dynamo compiled" in n for n in result.notes)


def test_ranked_rows_follow_the_stated_order(run_search):
    from torchscalpel.tune.speedup import RANK_ORDER, speedup_of

    result = run_search(FakeRunner({"amp=bf16": 60.0, "threads=2": 90.0, "optimizer=fused": 120.0}))
    ratios = [speedup_of(t).ratio for t in result.ranked()]
    measured = [r for r in ratios if r is not None]
    assert measured == sorted(measured, reverse=True) and ratios[: len(measured)] == measured
    assert RANK_ORDER == "ranked by speedup per step (each against the baseline run beside it)"


def test_later_pairs_are_budgeted_from_the_pair_just_run_not_the_cold_screening(monkeypatch, tmp_path):
    # screening held a cold compile (60 s); a confirmation run is warm (10 s): 3 pairs of 20 s fit in
    # what is left, where 3 pairs of 70 s (the screening's figure) would not
    clock = Clock()
    monkeypatch.setattr(budget_mod.time, "monotonic", clock)
    runner = FakeRunner({"amp=bf16": 60.0})

    def run(target, settings, out_dir, **kw):
        result = runner(target, settings, out_dir, **kw)
        cold = settings.label() == "amp=bf16" and "confirm" not in out_dir.name
        result.wall_s = 60.0 if cold else 10.0
        clock.t += result.wall_s
        return result

    monkeypatch.setattr(search_mod, "run_trial", run)
    options = TuneOptions(out_dir=tmp_path / "o", budget_s=190, steps=3, warmup=1, knobs=("amp",))
    result = search_mod.Search(Target(script=Path("t.py")), options, Recorder()).run()
    assert result.winner is not None and len(result.winner.confirm_pairs) == 3, result.notes


def test_a_contender_screened_above_the_confirmed_winner_is_confirmed_too_and_replaces_it(run_search):
    # compile(Block) screens 2.0x but confirms at 1.25x; bf16 + compile(Block) screened 1.82x, which "lost"
    # the combination to the block's screening pair: it is confirmed next and wins at 1.82x
    runner = FakeRunner(
        {"amp=bf16": 70.0, "compile(Block)": 50.0, "amp=bf16 + compile(Block)": 55.0},
        loss_scale={"amp=bf16": 1.01, "amp=bf16 + compile(Block)": 1.01},
        confirm={"compile(Block)": 80.0},
    )
    result = run_search(runner, knobs=("amp", "compile"))
    combined = next(t for t in result.trials if t.family == "combined")
    assert result.winner is not None and result.winner.label == combined.label
    assert result.confirmed_speedup == pytest.approx(100 / 55)
    block = next(t for t in result.trials if t.label == "compile(Block)")
    assert block.verdict == Verdict.NOT_CONFIRMED and "confirmed higher" in block.note
    confirmed = [c for c in runner.calls if "confirm-" in c and "baseline" not in c]
    assert sum(combined.label in c for c in confirmed) == 3


def test_no_contender_is_confirmed_when_nothing_screened_above_the_confirmed_figure(run_search):
    runner = FakeRunner({"amp=bf16": 70.0, "threads=2": 90.0, "amp=bf16 + threads=2": 69.0})
    result = run_search(runner, knobs=("amp", "threads"))
    assert result.winner is not None and result.winner.label == "amp=bf16"
    confirmed = {c.split(":", 1)[1] for c in runner.calls if "confirm-" in c and "baseline" not in c}
    assert confirmed == {"amp=bf16"}  # the 1.45x combination is not 3% above amp's confirmed 1.43x

"""torchscalpel.record_check.check_invariants: a consistent record passes, each broken invariant is named."""

from __future__ import annotations

import copy
import math

import pytest

from torchscalpel.record import RunRecord, StepRecord, load_record, save_record
from torchscalpel.record_check import check_invariants
from torchscalpel.runtime.summary import summarize


def valid() -> RunRecord:
    """Two warm-up steps, six measured (steps 3-4 profiled, step 5 FLOP-counted), a summary, FLOPs and a tune
    section whose speedups follow tune's one definition (tune/speedup.py: the lower-median confirmation pair)."""
    steps = []
    for i in range(8):
        phases = {"data": 1.0 + 0.1 * i, "forward": 3.0, "backward": 5.0, "optimizer": 1.0}
        total = sum(phases.values()) + 0.5
        steps.append(
            StepRecord(
                index=i,
                warmup=i < 2,
                total_ms=total,
                other_ms=0.5,
                samples=32,
                loss=2.0 / (i + 1),
                profiled=i in (3, 4, 5),
                flops_counted=i == 5,
                **{f"{k}_ms": v for k, v in phases.items()},
            )
        )
    r = RunRecord(
        status="stopped",
        steps=steps,
        tool_version="0.test",
        config={"warmup": 2, "steps": 6, "profile_steps": 2},
        profiler={
            "steps": [3, 4],
            "trace": "trace.json.gz",
            "flops_step": 5,
            "flops_total": 4.0e9,
            "flops_by_op": [
                {"name": "aten::mm", "count": 4, "flops": 3.0e9},
                {"name": "aten::addmm", "count": 2, "flops": 1.0e9},
            ],
            "flops_by_op_complete": True,
        },
    )
    r.summary = summarize(r)
    r.sections["tune"] = {
        "baseline": {"label": "baseline", "median_ms": 10.0},
        "trials": [
            {
                "label": "amp=bf16",
                "median_ms": 8.0,
                "baseline_ms": 10.0,
                "speedup": 1.2,
                "speedup_pair": [9.6, 8.0],
                "confirm_ratios": [1.2, 1.3],
                "confirm_pairs": [[9.6, 8.0], [10.4, 8.0]],
            },
            {
                "label": "threads=2",
                "median_ms": 9.0,
                "baseline_ms": 10.0,
                "speedup": 10.0 / 9.0,
                "speedup_pair": [10.0, 9.0],
            },
        ],
        "winner": {
            "label": "amp=bf16",
            "median_ms": 8.0,
            "baseline_ms": 10.0,
            "speedup": 1.2,
            "speedup_pair": [9.6, 8.0],
            "confirm_ratios": [1.2, 1.3],
            "confirm_pairs": [[9.6, 8.0], [10.4, 8.0]],
        },
        "confirmed_speedup": 1.2,
    }
    return r


def broken(edit) -> list[str]:
    r = copy.deepcopy(valid())
    edit(r)
    return check_invariants(r)


def test_a_consistent_record_passes_from_a_record_a_folder_and_a_file(tmp_path) -> None:
    assert check_invariants(valid()) == []
    save_record(valid(), tmp_path)
    assert check_invariants(tmp_path) == [] and check_invariants(tmp_path / "run.json") == []
    assert check_invariants(load_record(tmp_path)) == []


def test_phases_must_sum_to_the_step() -> None:
    found = broken(lambda r: setattr(r.steps[5], "forward_ms", 9.0))
    assert found[0].startswith("steps[5] (index 5): the phases sum to 17.000 ms but total_ms is 11.000 ms")


def test_a_negative_or_nan_time_is_named() -> None:
    assert broken(lambda r: setattr(r.steps[2], "data_ms", -1.0))[0].startswith(
        "steps[2] (index 2): data_ms not a finite time >= 0"
    )
    assert (
        "total_ms not a finite time >= 0 (total_ms=nan)"
        in broken(lambda r: setattr(r.steps[6], "total_ms", math.nan))[0]
    )


def test_step_indices_increase_and_warm_up_comes_first() -> None:
    assert "steps[4] (index 2): step index 2 does not increase (the step before is 3)" in "".join(
        broken(lambda r: setattr(r.steps[4], "index", 2))
    )
    assert "steps[6] (index 6): a warm-up step after measured step 2." in broken(
        lambda r: setattr(r.steps[6], "warmup", True)
    )


def test_the_profiler_window_lies_inside_the_recorded_training_steps() -> None:
    found = broken(lambda r: r.profiler.update(steps=[3, 4, 9]))
    assert found[0] == "profiler.steps [9]: not among the recorded training steps (8 recorded, indices 0-7)."
    found = broken(lambda r: setattr(r.steps[6], "profiled", True))
    assert found[0] == "profiler.steps [3, 4] and the steps marked profiled [3, 4, 6] differ."
    assert broken(lambda r: setattr(r.steps[5], "flops_counted", False))[
        0
    ] == (  # the counting step is not the window
        "profiler.steps [3, 4] and the steps marked profiled [3, 4, 5] differ."
    )
    assert "profiler.steps [1]: warm-up steps inside the profiler window." in broken(
        lambda r: (r.profiler.update(steps=[1, 3, 4]), setattr(r.steps[1], "profiled", True))
    )


def test_flops_are_non_negative_and_a_complete_op_list_sums_to_the_total() -> None:
    assert "profiler.flops_total is -5, not a count >= 0." in broken(
        lambda r: r.profiler.update(flops_total=-5)
    )
    assert broken(lambda r: r.profiler["flops_by_op"][1].update(flops=-1.0))[0].startswith(
        "profiler.flops_by_op[1] (aten::addmm): flops is -1.0"
    )
    found = broken(lambda r: r.profiler["flops_by_op"].pop())
    assert found == [
        "profiler.flops_by_op says it is complete but sums to 3e+09 FLOPs, not profiler.flops_total 4e+09."
    ]
    # a top-N list that does not claim to be complete, or no per-op list at all: nothing to sum
    # a per-op list with no counted step and no completeness claim (an old record's top-N list) may be partial
    assert (
        broken(
            lambda r: (
                r.profiler["flops_by_op"].pop(),
                r.profiler.pop("flops_by_op_complete"),
                r.profiler.pop("flops_step"),
            )
        )
        == []
    )
    assert broken(lambda r: (r.profiler.pop("flops_by_op"), r.profiler.pop("flops_total"))) == []


def test_every_summary_ratio_is_the_ratio_of_the_figures_beside_it() -> None:
    assert broken(lambda r: r.summary.update(samples_per_s=1234.0))[0].startswith(
        "summary.samples_per_s is 1234;"
    )
    assert broken(lambda r: r.summary.update(median_step_ms=3.0))[0].startswith(
        "summary.median_step_ms is 3.0000 ms;"
    )
    assert "summary.phase_share.forward is 0.5000" in "".join(
        broken(lambda r: r.summary["phase_share"].update(forward=0.5))
    )
    assert broken(lambda r: r.summary.update(achieved_flops_per_s=1.0))[0].startswith(
        "summary.achieved_flops_per_s is 1;"
    )
    assert "summary.phase_mean_ms sums to" in "".join(
        broken(lambda r: r.summary["phase_mean_ms"].update(forward=30.0))
    )
    assert broken(lambda r: r.summary.update(steps_summarized=6))[0].startswith(
        "summary.steps_total/steps_measured/steps_summarized are 8/6/6, the steps recorded give 8/6/3."
    )


def test_tune_speedups_are_the_ratios_of_the_step_times_recorded_beside_them() -> None:
    assert broken(lambda r: r.sections["tune"]["trials"][0].update(speedup=1.64)) == [
        "sections.tune trial 'amp=bf16': speedup 1.640x but its speedup_pair is 9.600 / 8.000 ms = 1.200x."
    ]
    assert broken(
        lambda r: r.sections["tune"]["trials"][0].update(speedup=1.25, speedup_pair=[10.0, 8.0])
    ) == [
        "sections.tune trial 'amp=bf16': speedup_pair [10.0, 8.0] is not a pair it was measured in "
        "([[9.6, 8.0], [10.4, 8.0]])."
    ]
    assert broken(lambda r: r.sections["tune"]["trials"][1].update(speedup=1.3)) == [
        "sections.tune trial 'threads=2': speedup 1.300x but its speedup_pair is 10.000 / 9.000 ms = 1.111x."
    ]
    assert broken(lambda r: r.sections["tune"]["trials"][1].pop("speedup_pair") and None) == []
    assert broken(
        lambda r: (
            r.sections["tune"]["trials"][1].pop("speedup_pair"),
            r.sections["tune"]["trials"][1].update(speedup=1.3),
        )
    ) == [
        "sections.tune trial 'threads=2': speedup 1.300x but baseline_ms / median_ms is 10.000 / 9.000 = 1.111x."
    ]
    assert broken(lambda r: r.sections["tune"]["trials"][0].update(confirm_ratios=[1.2, 1.5]))[0].startswith(
        "sections.tune trial 'amp=bf16': confirmation ratio 1.500x but its pair is 10.400 / 8.000 ms = 1.300x."
    )
    found = broken(lambda r: r.sections["tune"].update(confirmed_speedup=1.32))
    assert found == [
        "sections.tune.winner 'amp=bf16': speedup 1.200x differs from confirmed_speedup 1.320x "
        "(one candidate, two ratios shown)."
    ]


def test_no_nan_where_a_number_is_promised_but_a_nan_loss_is_a_fact() -> None:
    assert "summary.p90_step_ms is inf, where a number is promised." in broken(
        lambda r: r.summary.update(p90_step_ms=math.inf)
    )
    assert broken(lambda r: r.sections.update(plan={"rows": [{"peak": math.nan}]})) == [
        "sections.plan.rows[0].peak is nan, where a number is promised."
    ]
    assert (
        broken(lambda r: (setattr(r.steps[7], "loss", math.nan), r.summary.update(last_loss=math.nan))) == []
    )


@pytest.mark.broken_record("writes a newer-major record to see the fixture skip it")
def test_a_record_from_a_newer_major_is_refused_in_one_sentence(tmp_path) -> None:
    r = valid()
    r.schema_version = "9.0"
    save_record(r, tmp_path)
    with pytest.raises(Exception, match="newer than"):
        check_invariants(tmp_path)


@pytest.mark.broken_record("writes a record with a wrong samples/s to see scalpel report --check name it")
def test_scalpel_report_check_prints_each_violation_and_exits_1(tmp_path, capsys) -> None:
    from torchscalpel.cli.main import main

    save_record(valid(), tmp_path / "good")
    bad = valid()
    bad.summary["samples_per_s"] = 1234.0
    save_record(bad, tmp_path / "bad")
    assert main(["report", "--check", str(tmp_path / "good")]) == 0
    assert capsys.readouterr().out.endswith("good: consistent\n")
    assert main(["report", "--check", str(tmp_path / "good"), str(tmp_path / "bad")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith("bad: 1 invariant(s) broken") and lines[2].startswith(
        "  summary.samples_per_s is 1234;"
    )
    assert not (tmp_path / "good" / "report.html").exists()  # --check renders nothing


@pytest.mark.broken_record("leaves broken records under tmp_path to see the suite's check find them")
def test_the_suites_check_finds_every_broken_record_under_a_tests_folder(tmp_path, monkeypatch) -> None:
    import record_guard
    from record_guard import record_violations

    monkeypatch.setattr(
        record_guard, "KNOWN_VIOLATIONS", (("differs from confirmed_speedup", "a defect being fixed"),)
    )
    save_record(valid(), tmp_path / "ok" / "run.json")
    hand_made = valid()
    hand_made.tool_version, hand_made.steps[2].total_ms = "", 99.0  # a test's own fake: not a stage's record
    save_record(hand_made, tmp_path / "fake" / "run.json")
    bad = valid()
    bad.steps[3].forward_ms += 5.0
    save_record(bad, tmp_path / "out" / "rank-1" / "run.json")  # in an --out folder
    tuned = valid()
    tuned.sections["tune"]["confirmed_speedup"] = 1.32  # a known defect: a warning, not a failure
    save_record(tuned, tmp_path / "tune" / "run.json")
    failures, known = record_violations(tmp_path)
    assert failures == [
        "out/rank-1/run.json: steps[3] (index 3): the phases sum to 15.800 ms but total_ms is "
        "10.800 ms (more than 1% apart)."
    ]
    assert len(known) == 1 and known[0].startswith(
        "tune/run.json: sections.tune.winner 'amp=bf16': speedup 1.200x"
    )

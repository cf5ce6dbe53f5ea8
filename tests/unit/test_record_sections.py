"""Typed views of the Run record's dict parts (torchscalpel.sections): lossless round trips,
clear defaults for absent parts, misspelled keys as AttributeError, old records unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchscalpel.record import RunRecord, load_record, save_record
from torchscalpel.sections import (
    DoctorSection,
    PlanSection,
    ProfilerSection,
    RunConfig,
    RunSummary,
    SectionView,
    TraceSection,
    TuneSection,
)

SUMMARY = {
    "steps_total": 6,
    "steps_measured": 4,
    "steps_summarized": 3,
    "median_step_ms": 2.5,
    "mean_step_ms": 2.6,
    "min_step_ms": 2.0,
    "p90_step_ms": 3.5,
    "phase_mean_ms": {"data": 0.1, "forward": 1.0, "backward": 1.2, "optimizer": 0.2, "other": 0.1},
    "phase_share": {"data": 0.04, "forward": 0.38, "backward": 0.46, "optimizer": 0.08, "other": 0.04},
    "breakdown_max_error": 0.001,
    "samples_per_s": 1280.0,
    "first_loss": 2.3,
    "last_loss": 1.9,
    "rss_peak": 123456,
    "flops_per_step": 1.5e9,
    "achieved_flops_per_s": 6e11,
}
PROFILER = {
    "steps": [4, 5],
    "trace": "trace.json",
    "flops_total": 3000000000,
    "flops_by_op": [{"name": "aten::mm", "count": 4, "flops": 3000000000}],
}
CONFIG = {
    "warmup": 2,
    "steps": None,
    "profile_steps": 2,
    "module_times": False,
    "step_kind": "auto",
    "clock": "perf_counter",
}
TRACE = {
    "schema": "torchscalpel.trace/1",
    "ranks": [{"rank": 0}],
    "top_ops": [{"name": "aten::mm", "self_us": 900.0}],
    "top_kernels": [],
    "categories": {"matmul": 900.0},
    "gpu_categories": {},
    "memory": {"peak_bytes": 4096},
    "stragglers": None,
    "errors": [],
    "complete": True,
    "op_table": {},
    "kernel_table": {},
}
TUNE = {
    "baseline": {"label": "baseline", "median_ms": 3.0},
    "trials": [],
    "winner": None,
    "settings": {},
    "code_lines": [],
    "confirmed_speedup": None,
    "required_speedup": 1.05,
    "noise": 0.01,
    "determinism": 0.0,
    "facts": {},
    "notes": ["n"],
    "elapsed_s": 9.5,
    "interrupted": False,
    "baseline_refs": [3.0],
}
PLAN = {
    "version": 1,
    "model": "Net",
    "batch": "8x3",
    "rows": [{"strategy": "ddp", "peak": 1}],
    "alternatives": [],
    "device": {"name": "A100-80GB"},
    "recommendation": "ddp",
}
DOCTOR = {
    "rules_run": 30,
    "static_files": ["train.py"],
    "counts": {"warning": 1},
    "sanity": False,
    "notes": [],
    "hint": None,
}

CASES = [
    (RunSummary, SUMMARY),
    (ProfilerSection, PROFILER),
    (RunConfig, CONFIG),
    (TraceSection, TRACE),
    (TuneSection, TUNE),
    (PlanSection, PLAN),
    (DoctorSection, DOCTOR),
]


def _same_json(a: dict, b: dict) -> bool:
    return json.dumps(a) == json.dumps(b)  # key order included


@pytest.mark.parametrize(("cls", "data"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_each_view_round_trips_with_unknown_keys_in_their_place(cls: type[SectionView], data: dict) -> None:
    keys = list(data)
    mixed = {
        **dict(zip(keys[:1], [data[keys[0]]], strict=True)),
        "from_a_newer_minor": {"x": [1, 2]},
        **{k: data[k] for k in keys[1:]},
        "another_unknown": None,
    }
    view = cls.from_dict(mixed)
    assert view.extra == {"from_a_newer_minor": {"x": [1, 2]}, "another_unknown": None}
    assert _same_json(view.to_dict(), mixed)
    assert _same_json(cls.from_dict(data).to_dict(), data)
    assert cls.from_dict(view.to_dict()) == view


@pytest.mark.parametrize(("cls", "data"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_a_misspelled_key_is_an_attribute_error_not_a_silent_none(cls: type[SectionView], data: dict) -> None:
    view = cls.from_dict(data)
    with pytest.raises(AttributeError):
        view.no_such_key  # noqa: B018
    with pytest.raises(AttributeError):
        view.no_such_key = 1  # slots: no stray attribute either


def test_typed_fields_read_their_keys() -> None:
    r = RunRecord(
        summary=SUMMARY,
        profiler=PROFILER,
        config=CONFIG,
        sections={"trace": TRACE, "tune": TUNE, "plan": PLAN, "doctor": DOCTOR},
    )
    assert r.summary_view().median_step_ms == 2.5 and r.summary_view().phase_share["backward"] == 0.46
    assert r.profiler_view().steps == [4, 5] and r.profiler_view().trace == "trace.json"
    assert (
        r.config_view().warmup == 2
        and r.config_view().steps is None
        and r.config_view().clock == "perf_counter"
    )
    assert r.section(TraceSection).memory == {"peak_bytes": 4096}
    assert r.op_summary_view().top_ops[0]["name"] == "aten::mm"
    assert r.section(TuneSection).required_speedup == 1.05
    assert r.section(PlanSection).rows[0]["strategy"] == "ddp" and r.section(PlanSection).world_size is None
    assert r.section(DoctorSection).rules_run == 30


def test_a_record_without_a_part_gets_clear_defaults() -> None:
    r = RunRecord()
    s = r.summary_view()
    assert (s.steps_total, s.steps_measured, s.median_step_ms, s.phase_mean_ms, s.mfu) == (
        0,
        0,
        None,
        None,
        None,
    )
    assert (
        r.profiler_view().steps is None
        and r.profiler_view().trace is None
        and r.profiler_view().flops_by_op == []
    )
    c = r.config_view()
    assert (c.warmup, c.steps, c.clock, c.device) == (0, None, None, None)
    for kind in (TraceSection, TuneSection, PlanSection, DoctorSection):
        assert r.section(kind) is None
    assert r.op_summary_view().top_ops == [] and r.op_summary_view().memory is None
    assert RunRecord(sections={"plan": "not an object"}).section(PlanSection) is None
    assert RunRecord(sections={"doctor": {}}).section(DoctorSection) == DoctorSection()


def test_fresh_views_write_what_the_writers_always_wrote() -> None:
    assert RunSummary().to_dict() == {"steps_total": 0, "steps_measured": 0, "steps_summarized": 0}
    assert ProfilerSection(steps=[1]).to_dict() == {"steps": [1], "trace": None}
    cfg = RunConfig(warmup=1, steps=None, profile_steps=0, module_times=False, step_kind="auto").to_dict()
    assert list(cfg) == ["warmup", "steps", "profile_steps", "module_times", "step_kind"]
    s = RunSummary(steps_total=2, median_step_ms=0.0)
    assert s.to_dict()["median_step_ms"] == 0.0  # a zero is a value, not an absence
    assert "first_loss" not in s.to_dict()


def test_schema_1_0_op_copies_in_profiler_stay_in_extra_and_feed_the_op_view() -> None:
    old = RunRecord.from_dict(
        {
            "schema_version": "1.0",
            "profiler": {"steps": [3], "trace": None, "top_ops": [{"name": "aten::addmm"}]},
        }
    )
    assert old.profiler_view().extra == {"top_ops": [{"name": "aten::addmm"}]}
    assert old.op_summary_view().top_ops == [{"name": "aten::addmm"}]
    assert old.section(TraceSection) is None


def _v11_text() -> str:
    """A run.json as torchscalpel 1.1 wrote it (steps without the 1.2 per-step fields)."""
    step_keys = {
        "warmup": False,
        "start_ms": 0.0,
        "total_ms": 2.5,
        "data_ms": 0.1,
        "forward_ms": 1.0,
        "backward_ms": 1.2,
        "optimizer_ms": 0.1,
        "other_ms": 0.1,
        "loss": 2.0,
        "micro_batches": 1,
        "forward_calls": 1,
        "samples": 64,
        "cuda_allocated_peak": None,
        "cuda_reserved_peak": None,
        "rss": 1000,
        "profiled": False,
    }
    data = {
        "schema_version": "1.1",
        "name": "run",
        "created": "2026-01-01T00:00:00+0000",
        "tool_version": "0.1.0",
        "command": ["scalpel", "profile", "--", "train.py"],
        "target": {"script": "train.py", "args": []},
        "status": "stopped",
        "exit_code": 0,
        "error": None,
        "notes": [],
        "environment": {"python": "3.11"},
        "config": CONFIG,
        "step_kind": "optimizer",
        "steps": [{"index": 0, **step_keys}],
        "summary": SUMMARY,
        "modules": [],
        "profiler": PROFILER,
        "findings": [],
        "sections": {"trace": TRACE, "tune": TUNE, "plan": PLAN, "doctor": DOCTOR, "someone_elses": {"k": 1}},
        "artifacts": {"trace": "trace.json"},
    }
    return json.dumps(data, indent=1) + "\n"


@pytest.mark.broken_record("a hand-written 1.1 record abridged to one step under a summary of six")
def test_a_schema_1_1_record_loads_unchanged_and_its_parts_round_trip_to_the_same_json(
    tmp_path: Path,
) -> None:
    text = _v11_text()
    src = tmp_path / "old" / "run.json"
    src.parent.mkdir()
    src.write_text(text, encoding="utf-8")
    r = load_record(src)
    original = json.loads(text)
    views = {"summary": r.summary_view(), "profiler": r.profiler_view(), "config": r.config_view()}
    for name, view in views.items():
        assert _same_json(view.to_dict(), original[name]), name
    for kind in (TraceSection, TuneSection, PlanSection, DoctorSection):
        assert _same_json(r.section(kind).to_dict(), original["sections"][kind.KEY]), kind.KEY
    out = save_record(r, tmp_path / "new")  # reading the views changed nothing
    written = json.loads(out.read_text(encoding="utf-8"))
    # The one difference: StepRecord fills in the later per-step fields with their defaults.
    added = {"closure_evals": 0, "recomputed_forwards": 0, "skipped_update": False, "flops_counted": False}
    assert written["steps"] == [{**original["steps"][0], **added}]
    written["steps"] = original["steps"]
    assert json.dumps(written, indent=1) + "\n" == text
    assert written["schema_version"] == "1.1"
    again = save_record(load_record(out), tmp_path / "again")
    assert again.read_text(encoding="utf-8") == out.read_text(encoding="utf-8")


def test_report_readers_given_an_empty_record_build_nothing_or_defaults() -> None:
    from torchscalpel.report import findings_sections, plan_sections, profile_sections, tune_sections

    r = RunRecord()
    assert tune_sections.build(r) == [] and plan_sections.build(r) == [] and findings_sections.build(r) == []
    # no steps, no error: no "0 measured steps after 0 warm-up ... timing clock: ?" overview (a plan record)
    assert profile_sections.build(r) == []
    failed = profile_sections.build(RunRecord(status="failed", error="\x1b[31mboom\x1b[0m"))[0]
    assert "boom" in failed.body and "measured steps" not in failed.body and "clock" not in failed.body
    assert "\x1b" not in failed.body and "[31m" not in failed.body  # torch's colours stripped
    assert (
        tune_sections.build(RunRecord(sections={"tune": {"notes": []}})) == []
    )  # no baseline: nothing to rank
    assert findings_sections.build(RunRecord(sections={"doctor": {}}))[0].title == "Findings"


def test_the_runtime_writes_config_and_summary_through_the_views() -> None:
    from torchscalpel.record import StepRecord
    from torchscalpel.runtime.session import RuntimeOptions, new_record
    from torchscalpel.runtime.summary import run_summary, summarize

    rec = new_record(RuntimeOptions(warmup=1, steps=None), command=[], target={}, environment={})
    assert list(rec.config) == ["warmup", "steps", "profile_steps", "module_times", "step_kind"]
    assert rec.config["steps"] is None and rec.config_view().warmup == 1
    rec.steps = [
        StepRecord(index=0, warmup=True, total_ms=9.0),
        StepRecord(index=1, total_ms=2.0, forward_ms=2.0),
    ]
    typed = run_summary(rec)
    assert typed.median_step_ms == 2.0 and typed.first_loss is None
    assert summarize(rec) == typed.to_dict()
    assert "first_loss" not in summarize(rec) and "samples_per_s" not in summarize(rec)

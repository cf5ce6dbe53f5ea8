"""Run record: round trip, forward compatibility, version rejection."""

from __future__ import annotations

import json

import pytest

from torchscalpel.errors import RecordVersionError, ScalpelError
from torchscalpel.record import RunRecord, StepRecord, load_record, save_record


def _record() -> RunRecord:
    r = RunRecord(name="t", status="stopped", exit_code=0, target={"script": "x.py", "args": ["--a"]})
    r.steps = [
        StepRecord(index=0, warmup=True, total_ms=3.0),
        StepRecord(index=1, total_ms=2.0, loss=0.5, forward_ms=1.0),
    ]
    r.sections["tune"] = {"winner": {"label": "amp"}}  # a string winner is refused on load (sections.py)
    return r


def test_round_trip_keeps_every_field(tmp_path):
    r = _record()
    path = save_record(r, tmp_path)
    back = load_record(path)
    assert back.to_dict() == r.to_dict()
    assert back.measured_steps[0].loss == 0.5
    assert back.steps[1].phase_ms()["forward"] == 1.0


def test_unknown_keys_from_a_newer_minor_version_survive_a_round_trip(tmp_path):
    data = _record().to_dict() | {"schema_version": "1.7", "future_field": {"x": 1}}
    (tmp_path / "run.json").write_text(json.dumps(data))
    back = load_record(tmp_path)
    assert back.extra == {"future_field": {"x": 1}}
    assert back.to_dict()["future_field"] == {"x": 1}


def test_a_newer_major_version_is_refused_with_a_clear_error(tmp_path):
    data = _record().to_dict() | {"schema_version": "2.0"}
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(RecordVersionError, match="upgrade torchscalpel"):
        load_record(tmp_path)


def test_missing_and_corrupt_records_give_one_sentence(tmp_path):
    with pytest.raises(ScalpelError, match="No run record"):
        load_record(tmp_path / "nope")
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(ScalpelError, match="not valid JSON"):
        load_record(tmp_path)


def test_op_summary_reads_the_trace_section_and_falls_back_to_schema_1_0_copies():
    current = RunRecord(
        profiler={"steps": [3]}, sections={"trace": {"top_ops": [{"name": "aten::mm"}], "categories": {}}}
    )
    assert current.op_summary()["top_ops"] == [{"name": "aten::mm"}]
    old = RunRecord.from_dict(
        {
            "schema_version": "1.0",
            "profiler": {"steps": [3], "top_ops": [{"name": "aten::addmm"}], "memory": {"peak_bytes": 5}},
        }
    )
    assert old.op_summary() == {"top_ops": [{"name": "aten::addmm"}], "memory": {"peak_bytes": 5}}
    assert RunRecord().op_summary() == {}

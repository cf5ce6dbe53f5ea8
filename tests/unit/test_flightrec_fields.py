"""The NCCL flight-recorder summary on dumps whose fields have unexpected types (issue 30, item 7).

A dump is another process's file; the hang watch summarises it before it stops the ranks, so a field
of the wrong type must be left out with a note, never raised on, and the ranks are stopped whatever
happens while summarising."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchscalpel.distributed.flightrec import describe_summary, dump_summary, summarize_dumps


def _entry(**over: Any) -> dict[str, Any]:
    entry = {
        "profiling_name": "nccl:all_reduce",
        "process_group": ("0", "default_pg"),
        "collective_seq_id": 42,
        "state": "started",
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "frames": [{"name": "step", "filename": "/home/u/train.py", "line": 88}],
    }
    entry.update(over)
    return entry


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("process_group", 7),
        ("process_group", {"name": "0"}),
        ("frames", 3),
        ("input_dtypes", 5),
        ("input_sizes", "big"),
        ("collective_seq_id", "x"),
        ("state", ["started"]),
        ("profiling_name", 1),
    ],
)
def test_a_field_of_the_wrong_type_is_left_out_with_a_note(field: str, value: Any) -> None:
    summary = dump_summary({"version": "2.4", "entries": [_entry(**{field: value})]})
    assert summary["entries"] == 1
    assert any(f"entry 0: {field} is {type(value).__name__}" in n for n in summary["notes"]), summary
    json.dumps(summary)  # it goes into hang.json as it is
    assert "notes on unreadable fields" in describe_summary(summary) or summary["waiting_in"]["state"] == "?"


def test_entries_that_are_not_dicts_and_a_non_list_are_noted() -> None:
    summary = dump_summary({"entries": [3, _entry()]})
    assert summary["entries"] == 1 and summary["notes"] == ["entry 0: a int, not a dict; skipped"]
    assert describe_summary(summary).startswith("in all_reduce #42 (started) [[4]] Float from train.py:88")
    assert dump_summary({"entries": {"a": 1}})["notes"] == ["entries is dict, not a list; nothing read"]


def test_a_good_entry_has_no_notes() -> None:
    summary = dump_summary({"entries": [_entry()]})
    assert "notes" not in summary
    assert describe_summary(summary) == "in all_reduce #42 (started) [[4]] Float from train.py:88"


def test_notes_are_capped() -> None:
    summary = dump_summary({"entries": [_entry(process_group=1) for _ in range(500)]})
    assert len(summary["notes"]) == 21 and summary["notes"][-1] == "and 480 more"


def test_summarize_dumps_keeps_every_rank(tmp_path: Path) -> None:
    bad = tmp_path / "nccl_trace_rank_0"
    bad.write_bytes(pickle.dumps({"entries": [_entry(process_group=5, frames=1, input_dtypes=2)]}))
    good = tmp_path / "nccl_trace_rank_1"
    good.write_bytes(pickle.dumps({"entries": [_entry()]}))
    got = summarize_dumps({"0": str(bad), "1": str(good)})
    assert len(got["0"]["notes"]) == 3 and got["0"]["waiting_in"]["group"] == "?"
    assert "notes" not in got["1"]


def _watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[int]]:
    from torchscalpel.distributed import flightrec, hangwatch

    killed: list[int] = []
    monkeypatch.setattr(hangwatch, "kill_rank", killed.append)
    monkeypatch.setattr(hangwatch.HangWatch, "_stacks", lambda self, logs: ({}, {}))
    monkeypatch.setattr(hangwatch.HangWatch, "still_working", lambda self, logs, stacks: [])
    monkeypatch.setattr(hangwatch, "diagnose", lambda *a: {"summary": "rank 0 waits", "ranks": {}})
    monkeypatch.setattr(flightrec, "request_dumps", lambda folder, ranks: None)
    dump = tmp_path / "nccl_trace_rank_0"
    dump.write_bytes(pickle.dumps({"entries": [_entry(process_group={"x": 1}, frames=9)]}))
    monkeypatch.setattr(flightrec, "collect_dumps", lambda folder, out, ranks: {0: str(dump)})
    options = hangwatch.WatchOptions(folder=tmp_path, report_dir=tmp_path, local_ranks=2, nccl_trace=True)
    return hangwatch.HangWatch(options), killed


def _logs() -> dict[int, Any]:
    return {r: SimpleNamespace(pid=1000 + r, last_progress=0.0) for r in range(2)}


def test_hang_watch_notes_bad_fields_in_hang_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watch, killed = _watch(tmp_path, monkeypatch)
    watch.handle_hang(_logs(), 10.0, 12.0)
    assert killed == [1000, 1001]
    saved = json.loads((tmp_path / "hang.json").read_text())
    assert "entry 0: process_group is dict" in saved["nccl_summary"]["0"]["notes"][0]


def test_hang_watch_stops_the_ranks_when_summarising_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchscalpel.distributed import flightrec

    def boom(paths: Any) -> Any:
        raise RuntimeError("a reader bug")

    monkeypatch.setattr(flightrec, "summarize_dumps", boom)
    watch, killed = _watch(tmp_path, monkeypatch)
    watch.handle_hang(_logs(), 10.0, 12.0)
    assert killed == [1000, 1001]
    saved = json.loads((tmp_path / "hang.json").read_text())
    assert "RuntimeError: a reader bug" in saved["nccl_error"]
    assert "were not summarised" in (tmp_path / "hang.txt").read_text()


# ---- issue 41: numbers and texts no dump of torch's holds, memo bombs --------------------------------------

HUGE = 10**5000  # Python will not turn it into text (int_max_str_digits): str() and json.dumps raise


def _ranked_diagnosis(*args: Any) -> dict[str, Any]:
    rank = {"where": "in all_reduce #3", "steps": 1, "last_collectives": [], "stack": []}
    return {"summary": "rank 0 waits", "ranks": {"0": dict(rank), "1": dict(rank)}}


def test_a_5000_digit_int_in_a_dump_still_gives_hang_json_and_hang_txt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchscalpel.distributed import flightrec, hangwatch

    watch, killed = _watch(tmp_path, monkeypatch)
    monkeypatch.setattr(hangwatch, "diagnose", _ranked_diagnosis)
    dump = tmp_path / "huge_rank_0"
    entry = _entry(
        input_sizes=[[HUGE, 4]],
        collective_seq_id=HUGE,
        process_group=("0", "pg\ud800"),
        frames=[{"name": "step", "filename": "/home/u/train.py", "line": HUGE}],
    )
    dump.write_bytes(pickle.dumps({"version": HUGE, "entries": [entry]}))
    monkeypatch.setattr(flightrec, "collect_dumps", lambda folder, out, ranks: {0: str(dump)})
    watch.handle_hang(_logs(), 10.0, 12.0)
    assert killed == [1000, 1001]
    saved = json.loads((tmp_path / "hang.json").read_text(encoding="utf-8"))
    summary = saved["nccl_summary"]["0"]
    assert summary["waiting_in"]["seq"] is None and summary["waiting_in"]["sizes"] is None
    assert summary["waiting_in"]["site"] == "train.py:?" and summary["version"] is None
    assert any("input_sizes is list, not a list of int64 lists" in n for n in summary["notes"])
    text = (tmp_path / "hang.txt").read_text(encoding="utf-8")
    assert "NCCL flight recorder: in all_reduce #? (started) Float from train.py:?" in text


def test_a_memo_bomb_dump_is_refused_in_one_sentence(tmp_path: Path) -> None:
    """0.2 MB naming one entry of 10^5 frames 10^4 times: 10^9 frames for whoever walks it."""
    frames = [{"name": "step", "filename": "/home/u/train.py", "line": 1}] * 100_000
    dump = tmp_path / "nccl_trace_rank_0"
    dump.write_bytes(pickle.dumps({"entries": [_entry(frames=frames)] * 10_000}))
    assert dump.stat().st_size < 250_000
    got = summarize_dumps({"0": str(dump)})
    error = got["0"]["error"]
    assert error.startswith(
        f"{dump} is not an NCCL flight recorder dump (it names its own parts over and over"
    )
    assert "\n" not in error


def test_the_report_is_written_without_the_summary_when_the_summary_cannot_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchscalpel.distributed import flightrec, hangwatch

    watch, killed = _watch(tmp_path, monkeypatch)
    monkeypatch.setattr(hangwatch, "diagnose", _ranked_diagnosis)
    monkeypatch.setattr(
        flightrec, "summarize_dumps", lambda paths: {"0": {"waiting_in": None, "entries": HUGE}}
    )
    watch.handle_hang(_logs(), 10.0, 12.0)
    assert killed == [1000, 1001]
    saved = json.loads((tmp_path / "hang.json").read_text())
    assert "nccl_summary" not in saved and "could not be written (ValueError)" in saved["nccl_error"]
    assert "could not be written" in (tmp_path / "hang.txt").read_text()


ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.just(2**64),
    st.floats(),
    st.text(max_size=5),
    st.just("\ud800"),
    st.just("x" * 10_000),
    st.binary(max_size=3),
)
NESTED = st.recursive(ODD, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner), max_leaves=6)
FIELDS = [
    "profiling_name",
    "process_group",
    "collective_seq_id",
    "state",
    "input_sizes",
    "input_dtypes",
    "frames",
]


@settings(
    max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
@given(
    over=st.dictionaries(st.sampled_from(FIELDS), NESTED, max_size=4),
    version=NESTED,
    repeat=st.sampled_from([1, 3]),
)
def test_fuzz_any_field_values_give_a_summary_that_writes(
    over: dict[str, Any], version: Any, repeat: int
) -> None:
    summary = dump_summary({"version": version, "entries": [_entry(**over)] * repeat})
    text = json.dumps(summary) + describe_summary(summary)
    text.encode("utf-8")  # no lone surrogate reaches hang.txt
    assert len(describe_summary(summary)) < 2000

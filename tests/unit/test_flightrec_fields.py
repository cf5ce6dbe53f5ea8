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

"""NCCL flight recorder plumbing (no GPU here): the env added at launch, the request/collect exchange."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest

from torchscalpel.distributed.flightrec import BUFFER_ENV, FILE_ENV, collect_dumps, request_dumps, trace_env


def test_trace_env_only_on_cuda_and_keeps_the_users_values(tmp_path: Path):
    assert trace_env({}, tmp_path, cuda=False) == {}
    assert trace_env({}, tmp_path, cuda=True) == {
        BUFFER_ENV: "2000",
        FILE_ENV: str(tmp_path / "nccl-timeout-dump-rank-"),
    }
    assert trace_env({BUFFER_ENV: "0", FILE_ENV: "/x/"}, tmp_path, cuda=True) == {}


def test_request_answered_by_one_rank_and_not_the_other(tmp_path: Path):
    watch, report = tmp_path / "watch", tmp_path / "out"
    watch.mkdir()
    request_dumps(watch, [0, 1])
    assert sorted(p.name for p in watch.iterdir()) == ["rank-0.nccl-request", "rank-1.nccl-request"]

    def rank0_answers() -> None:  # what the rank's dumper thread does
        (watch / "rank-0.nccl-trace.pickle").write_bytes(b"trace")

    threading.Timer(0.2, rank0_answers).start()
    got = collect_dumps(watch, report, [0, 1], wait_s=2)
    assert (
        got[0] == str(report / "nccl-trace" / "nccl_trace_rank_0") and Path(got[0]).read_bytes() == b"trace"
    )
    assert got[1].startswith("no dump within 2 s")
    assert list(watch.iterdir()) == []  # requests withdrawn, the dump moved next to hang.json


def test_no_dumper_thread_on_a_cpu_build(tmp_path: Path):
    from torchscalpel.runtime.flight_dumper import start_flight_dumper

    assert start_flight_dumper(tmp_path, 0) is None


def _entry(seq: int, op: str, state: str, line: int, sizes=((4,),)) -> dict:
    """One entry as torch's _dump_nccl_trace writes it (the keys torch's own fr_trace reads)."""
    return {
        "record_id": seq,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": seq * 1000,
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": ["Float"] * len(sizes),
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": ["Float"] * len(sizes),
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
        "frames": [
            {
                "name": "all_reduce",
                "filename": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                "line": 2800,
            },
            {"name": "<module>", "filename": "/home/u/train.py", "line": line},
        ],
    }


def _dump(tmp_path: Path, entries: list[dict], name: str = "nccl_trace_rank_1") -> Path:
    path = tmp_path / name
    path.write_bytes(
        pickle.dumps(
            {
                "version": "2.4",
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                "pg_status": {},
                "entries": entries,
            }
        )
    )
    return path


def test_a_dump_names_the_collective_the_rank_waits_in(tmp_path: Path):
    from torchscalpel.distributed.flightrec import describe_summary, dump_summary, read_dump

    path = _dump(
        tmp_path,
        [
            _entry(41, "all_reduce", "completed", 80),
            _entry(42, "all_reduce", "started", 88),
            _entry(43, "broadcast", "scheduled", 95, sizes=((3,),)),
        ],
    )
    summary = dump_summary(read_dump(path))
    assert summary["entries"] == 3 and summary["waiting_in"]["seq"] == 42
    assert describe_summary(summary) == "in all_reduce #42 (started) [[4]] Float from train.py:88"
    done = dump_summary(read_dump(_dump(tmp_path, [_entry(1, "barrier", "completed", 5)], "d2")))
    assert describe_summary(done) == "every recorded collective completed (1 entries)"


def test_a_dump_that_is_code_or_not_a_dump_is_refused_in_one_sentence(tmp_path: Path):
    from torchscalpel.distributed.flightrec import read_dump, summarize_dumps

    class Boom:
        def __reduce__(self):
            return (print, ("ran code from a dump",))

    evil = tmp_path / "nccl_trace_rank_0"
    evil.write_bytes(pickle.dumps({"entries": [Boom()]}))
    with pytest.raises(ValueError, match="is not an NCCL flight recorder dump"):
        read_dump(evil)
    (tmp_path / "text").write_text(
        "RuntimeError('recorder off')"
    )  # what the dumper writes when the dump fails
    got = summarize_dumps({"0": str(evil), "1": str(tmp_path / "text"), "2": "no dump within 10 s (...)"})
    assert (
        "is not plain data" in got["0"]["error"]
        and "is not an NCCL flight recorder dump" in got["1"]["error"]
    )
    assert got["2"] == {"error": "no dump within 10 s (...)"}


def test_the_hang_report_shows_each_ranks_recorder_line(tmp_path: Path):
    from torchscalpel.distributed.flightrec import summarize_dumps
    from torchscalpel.distributed.hangdiag import format_report

    path = _dump(tmp_path, [_entry(42, "all_reduce", "started", 88)])
    diag = {
        "summary": "rank 1 is in barrier #42 from train.py:95",
        "idle_s": 6.0,
        "hang_timeout_s": 6,
        "ranks": {
            "0": {
                "where": "in all_reduce #42 from train.py:88",
                "steps": 3,
                "last_collectives": [],
                "stack": [],
            },
            "1": {
                "where": "in barrier #42 from train.py:95",
                "steps": 3,
                "last_collectives": [],
                "stack": [],
            },
        },
        "nccl_summary": summarize_dumps({"0": str(path), "1": "no dump within 10 s (the rank is dead)"}),
    }
    text = format_report(diag)
    assert (
        "rank 0: in all_reduce #42 from train.py:88 (steps done: 3)\n  NCCL flight recorder: in all_reduce #42 "
        "(started) [[4]] Float from train.py:88" in text
    )
    assert "  NCCL flight recorder: no dump within 10 s (the rank is dead)" in text

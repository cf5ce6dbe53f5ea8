"""NCCL flight recorder plumbing (no GPU here): the env added at launch, the request/collect exchange."""

from __future__ import annotations

import threading
from pathlib import Path

from torchscalpel.distributed.flightrec import BUFFER_ENV, FILE_ENV, collect_dumps, request_dumps, trace_env


def test_trace_env_only_on_cuda_and_keeps_the_users_values(tmp_path: Path):
    assert trace_env({}, tmp_path, cuda=False) == {}
    assert trace_env({}, tmp_path, cuda=True) == {BUFFER_ENV: "2000", FILE_ENV: str(tmp_path / "nccl-timeout-dump-rank-")}
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
    assert got[0] == str(report / "nccl-trace" / "nccl_trace_rank_0") and Path(got[0]).read_bytes() == b"trace"
    assert got[1].startswith("no dump within 2 s")
    assert list(watch.iterdir()) == []  # requests withdrawn, the dump moved next to hang.json


def test_no_dumper_thread_on_a_cpu_build(tmp_path: Path):
    from torchscalpel.runtime.collectives import start_flight_dumper

    assert start_flight_dumper(tmp_path, 0) is None

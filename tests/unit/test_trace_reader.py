"""The streaming reader: same events as json.load, at any chunk size; clear errors with byte offsets."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from helpers import COMMITTED_TRACES
from torchscalpel.trace import TraceReader, TraceReadError, analyze_traces

SHARED_FILES = [
    "alexnet_gpu/trace.json.gz",
    "compare/base.json.gz",
    "cpu_only/rank-34.json.gz",
    "gpu_2rank/rank-0.json.gz",
    "rocm_mi250/trace.json.gz",
]
COMMITTED_FILES = sorted(str(p.relative_to(COMMITTED_TRACES)) for p in COMMITTED_TRACES.rglob("*.json.gz"))
ALL = [("committed", name) for name in COMMITTED_FILES] + [("shared", name) for name in SHARED_FILES]


def _read(path: Path, chunk: int) -> tuple[list, TraceReader]:
    r = TraceReader(path, chunk_bytes=chunk)
    events = [e for batch in r.batches() for e in batch]
    return events, r


@pytest.mark.parametrize(("which", "name"), ALL)
@pytest.mark.parametrize("chunk", [257, 4096, 1 << 20])
def test_reader_matches_json_load(which: str, name: str, chunk: int, request: pytest.FixtureRequest) -> None:
    root = COMMITTED_TRACES if which == "committed" else request.getfixturevalue("traces_dir")
    path = root / name
    ref = json.loads(gzip.decompress(path.read_bytes()))
    events, r = _read(path, chunk)
    assert len(events) == len(ref["traceEvents"])
    assert set(r.meta) == set(ref) - {"traceEvents"}
    for e, d in zip(events, ref["traceEvents"], strict=True):
        assert e.name == d.get("name", "")
        assert e.ts == d.get("ts")
        if "correlation" in d.get("args", {}):
            assert e.args.correlation == d["args"]["correlation"]


def test_plain_json_and_newlines_between_events(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"op{i}",
            "ts": i * 10,
            "dur": 5,
            "pid": 1,
            "tid": 1,
            "args": {"nested": [{"a": "}, {"}, {"b": 1}]},
        }
        for i in range(50)
    ]
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            {"traceEvents": events, "distributedInfo": {"rank": 3, "pg": [{"x": 1}, {"y": 2}]}}, indent=2
        )
    )
    got, r = _read(path, 300)
    assert [e.name for e in got] == [f"op{i}" for i in range(50)]
    assert r.meta["distributedInfo"]["rank"] == 3


def test_fields_of_unexpected_types_fall_back(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "ts": "12",
            "dur": 3,
            "args": {"correlation": "7", "stream": 7},
        }
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got, _ = _read(path, 1 << 20)
    assert got[0].ts == 12.0 and got[0].args.correlation == 7.0


@pytest.mark.parametrize("frac", [0.3, 0.5, 0.99])
def test_truncated_file_reports_offset_and_keeps_events(frac: float, tmp_path: Path, trace_set: Path) -> None:
    raw = gzip.decompress((trace_set / "gpu_2rank/rank-0.json.gz").read_bytes())
    cut = int(len(raw) * frac)
    path = tmp_path / "cut.json"
    path.write_bytes(raw[:cut])
    r = TraceReader(path, chunk_bytes=65536)
    n = 0
    with pytest.raises(TraceReadError) as info:
        for batch in r.batches():
            n += len(batch)
    err = info.value
    assert "truncated" in str(err) and f"byte {err.offset}" in str(err)
    # every event that ends before the cut was read; the offset is where the unfinished one starts
    complete = raw[:cut].count(b'}, {"ph"')
    assert n == complete == err.events_read
    assert raw[err.offset : err.offset + 7] == b'{"ph": '
    assert cut - err.offset < 2000


@pytest.mark.parametrize("chunk", [4096, 1 << 24])
def test_corrupt_byte_is_located(chunk: int, tmp_path: Path, trace_set: Path) -> None:
    raw = gzip.decompress((trace_set / "gpu_2rank/rank-0.json.gz").read_bytes())
    i = raw.index(b"}, {", len(raw) // 2) + 3
    path = tmp_path / "bad.json"
    path.write_bytes(raw[:i] + b"@@" + raw[i:])
    with pytest.raises(TraceReadError) as info:
        for _ in TraceReader(path, chunk_bytes=chunk).batches():
            pass
    assert info.value.offset == i
    assert "corrupt" in str(info.value)
    assert info.value.events_read == raw[:i].count(b'}, {"ph"') + 1  # + the first event


def test_truncated_gzip_is_reported(tmp_path: Path, trace_set: Path) -> None:
    comp = (trace_set / "gpu_2rank/rank-0.json.gz").read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(comp[: len(comp) // 2])
    with pytest.raises(TraceReadError, match="gzip stream ends early"):
        for _ in TraceReader(path).batches():
            pass


def test_analysis_of_truncated_file_keeps_what_was_read(tmp_path: Path, trace_set: Path) -> None:
    raw = gzip.decompress((trace_set / "gpu_2rank/rank-0.json.gz").read_bytes())
    path = tmp_path / "rank-0.json"
    path.write_bytes(raw[: len(raw) // 2])
    result = analyze_traces([path])
    assert not result.complete
    assert result.errors[0]["byte_offset"] > 0
    rank = result.ranks[0]
    assert rank["events"] == raw[: len(raw) // 2].count(b'}, {"ph"') > 40 and rank["complete"] is False
    assert result.top_ops
    with pytest.raises(TraceReadError):
        analyze_traces([path], strict=True)


def test_not_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}')
    from torchscalpel.trace.reader import NotATraceError  # a usage error (exit 2), issue 30 item 5

    with pytest.raises(NotATraceError, match="traceEvents"):
        for _ in TraceReader(path).batches():
            pass
    empty = tmp_path / "e.json"
    empty.write_text("")
    with pytest.raises(TraceReadError, match="empty"):
        for _ in TraceReader(empty).batches():
            pass


def test_stdlib_json_path_gives_the_same_analysis(monkeypatch: pytest.MonkeyPatch, trace_set: Path) -> None:
    """Without msgspec (extra "trace" not installed) the reader decodes pieces with the json module."""
    from torchscalpel.trace import reader

    fast = analyze_traces(trace_set / "gpu_2rank").to_dict()
    monkeypatch.setattr(reader, "USE_MSGSPEC", False)
    slow = analyze_traces(trace_set / "gpu_2rank").to_dict()
    assert slow["ranks"][0]["gpu"] == fast["ranks"][0]["gpu"]
    assert slow["top_ops"] == fast["top_ops"]


def test_bare_array_form(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2, "pid": 1, "tid": 1}] * 3
    path = tmp_path / "bare.json"
    path.write_text("\n " + json.dumps(events))
    got, r = _read(path, 64)
    assert [e.name for e in got] == ["aten::mm"] * 3 and r.meta == {}

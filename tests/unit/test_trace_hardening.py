"""Hostile traces (issue 19, item 12): the reader stays linear on any input, deep nesting and absurd
times are reported instead of crashing or becoming steps, and ``--json`` never writes a bare NaN.

Linearity is shown by counting the bytes the splitter searches and the decoders are handed (wrapping
the reader's own functions), never by timing: the count grows with the input, not with its square.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli
from torchscalpel.trace import TraceReader, analyze_traces
from torchscalpel.trace import reader as reader_mod

CHUNK = 4096


def _work(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    """(bytes searched + bytes decoded, events read, bytes of JSON) for one read of ``path``."""
    work = [0]
    last_sep, decode = reader_mod._last_sep, reader_mod.TraceReader._decode

    def counting_sep(buf, *rest):
        work[0] += len(buf) - (rest[0] if rest else 0)
        return last_sep(buf, *rest)

    def counting_decode(self, buf, end, base, *, final):
        work[0] += end
        return decode(self, buf, end, base, final=final)

    monkeypatch.setattr(reader_mod, "_last_sep", counting_sep)
    monkeypatch.setattr(reader_mod.TraceReader, "_decode", counting_decode)
    r = TraceReader(path, chunk_bytes=CHUNK)
    n = sum(len(b) for b in r.batches())
    monkeypatch.undo()
    return work[0], n, r.bytes_read


def _trace(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _op(i: int, name: str = "aten::mm") -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": 10.0 * i, "dur": 5.0, "pid": 1, "tid": 1}


@pytest.mark.parametrize("filler", [",", "}, {"], ids=["commas", "separators-in-strings"])
def test_splitter_is_linear_in_the_size_of_one_huge_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filler: str
) -> None:
    # One event whose name is n fillers long spans n*len/CHUNK chunks; the old splitter searched (and
    # re-decoded) the whole growing buffer at every chunk: 4x the input cost 16x the work.
    small, big = 40_000, 160_000
    counts = {}
    for n in (small, big):
        p = _trace(tmp_path / f"t{n}.json", [_op(0), _op(1, filler * n), _op(2)])
        work, events, size = _work(p, monkeypatch)
        assert events == 3
        counts[n] = (work, size)
    (w_small, s_small), (w_big, s_big) = counts[small], counts[big]
    assert w_big / w_small < 1.5 * (s_big / s_small), counts
    assert w_big < 6 * s_big, counts


def test_splitter_is_linear_in_the_number_of_comma_heavy_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = {}
    for n in (200, 800):
        p = _trace(tmp_path / f"e{n}.json", [_op(i, "a," * 3000 + str(i)) for i in range(n)])
        work, events, size = _work(p, monkeypatch)
        assert events == n
        counts[n] = (work, size)
    assert counts[800][0] / counts[200][0] < 1.5 * 4, counts
    assert counts[800][0] < 6 * counts[800][1], counts


def test_deeply_nested_args_are_a_corrupt_event_not_a_crash(tmp_path: Path) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    text = (
        '{"traceEvents": [' + json.dumps(_op(0)) + ', {"ph": "X", "name": "x", "args": {"a": ' + deep + "}}]}"
    )
    p = tmp_path / "deep.json"
    p.write_text(text)
    result = analyze_traces(p)
    assert result.ranks[0]["events"] == 1
    assert "nested too deeply" in result.errors[0]["reason"]
    proc = run_cli("analyze", str(p), timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _bad_times(tmp_path: Path) -> Path:
    events = []
    for i, dur in enumerate([1000.0, float("nan"), -5.0, 1e308]):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{i}",
                "ts": 2000.0 * i,
                "dur": dur,
                "pid": 1,
                "tid": 1,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "ts": 2000.0 * i + 1,
                "dur": 10.0 if i == 0 else dur,
                "pid": 1,
                "tid": 1,
            }
        )
    return _trace(tmp_path / "times.json", events)  # json.dumps writes NaN as the bare literal


def test_nan_negative_and_huge_durations_are_invalid_events_not_steps(tmp_path: Path) -> None:
    result = analyze_traces(_bad_times(tmp_path))
    rank = result.ranks[0]
    assert [s["name"] for s in rank["steps"]] == ["ProfilerStep#0"]
    assert rank["steps"][0]["dur_us"] == 1000.0
    assert rank["invalid_events"] == 6
    assert result.top_ops[0]["self_us"] == 10.0


def test_analyze_json_never_holds_a_bare_nan(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    proc = run_cli("analyze", str(_bad_times(tmp_path)), "--json", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "6 invalid event(s) left out" in proc.stdout

    def refuse(name: str) -> None:
        raise AssertionError(f"bare {name} in --json output")

    json.loads(out.read_text(), parse_constant=refuse)


def test_analyze_json_to_a_full_device_is_one_sentence(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    proc = run_cli("analyze", str(_trace(tmp_path / "ok.json", [_op(0)])), "--json", "/dev/full", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "/dev/full" in proc.stderr


def test_categorize_looks_at_a_bounded_prefix_of_a_name() -> None:
    # A 32 MB op name took the category rules 80 s of regex work; they now read the first 16 KiB only.
    from torchscalpel.trace.categories import CATEGORIZE_CHARS, categorize

    assert categorize("x" * CATEGORIZE_CHARS + "aten::mm") == "other"
    assert categorize("aten::mm" + "," * 1_000_000) == "matmul"

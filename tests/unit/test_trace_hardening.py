"""Hostile traces (issue 19, item 12): the reader stays linear on any input, deep nesting and absurd
times are reported instead of crashing or becoming steps (``scalpel analyze`` on the same files, and its
``--json`` that never writes a bare NaN: tests/integration/test_trace_hardening_cli.py).

Linearity is shown by counting the bytes the splitter searches and the decoders are handed (wrapping
the reader's own functions), never by timing: the count grows with the input, not with its square.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from torchscalpel.trace import TraceReader, analyze_traces
from torchscalpel.trace import reader as reader_mod
from trace_builders import bad_times_trace, deeply_nested_trace, op_event, write_events

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


@pytest.mark.parametrize("filler", [",", "}, {"], ids=["commas", "separators-in-strings"])
def test_splitter_is_linear_in_the_size_of_one_huge_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filler: str
) -> None:
    # One event whose name is n fillers long spans n*len/CHUNK chunks; the old splitter searched (and
    # re-decoded) the whole growing buffer at every chunk: 4x the input cost 16x the work.
    small, big = 40_000, 160_000
    counts = {}
    for n in (small, big):
        p = write_events(tmp_path / f"t{n}.json", [op_event(0), op_event(1, filler * n), op_event(2)])
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
        p = write_events(tmp_path / f"e{n}.json", [op_event(i, "a," * 3000 + str(i)) for i in range(n)])
        work, events, size = _work(p, monkeypatch)
        assert events == n
        counts[n] = (work, size)
    assert counts[800][0] / counts[200][0] < 1.5 * 4, counts
    assert counts[800][0] < 6 * counts[800][1], counts


def test_deeply_nested_args_are_a_corrupt_event_not_a_crash(tmp_path: Path) -> None:
    # `scalpel analyze` on the same file (one line, no traceback): tests/integration/test_trace_hardening_cli.py
    result = analyze_traces(deeply_nested_trace(tmp_path / "deep.json"))
    assert result.ranks[0]["events"] == 1
    assert "nested too deeply" in result.errors[0]["reason"]


def test_nan_negative_and_huge_durations_are_invalid_events_not_steps(tmp_path: Path) -> None:
    result = analyze_traces(bad_times_trace(tmp_path))
    rank = result.ranks[0]
    assert [s["name"] for s in rank["steps"]] == ["ProfilerStep#0"]
    assert rank["steps"][0]["dur_us"] == 1000.0
    assert rank["invalid_events"] == 6
    assert result.top_ops[0]["self_us"] == 10.0


def test_categorize_looks_at_a_bounded_prefix_of_a_name() -> None:
    # A 32 MB op name took the category rules 80 s of regex work; they now read the first 16 KiB only.
    from torchscalpel.trace.categories import CATEGORIZE_CHARS, categorize

    assert categorize("x" * CATEGORIZE_CHARS + "aten::mm") == "other"
    assert categorize("aten::mm" + "," * 1_000_000) == "matmul"

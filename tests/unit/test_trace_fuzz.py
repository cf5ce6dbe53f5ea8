"""Fuzzing of the trace reader (issue 41, item 5): a small real-shaped Chrome trace (the committed 2-rank GPU
rank 0, scripts/make_test_traces.py) with one value of an event or of the header replaced by a wrong type, a huge
or non-finite number or a lone surrogate, or its bytes cut or flipped, written plain or gzipped, goes through
what ``scalpel analyze`` runs (the streaming reader, the analyses, the terminal summary, the HTML page, the JSON):
one sentence (:class:`UsageError` / :class:`ScalpelError`) or an analysis, never anything else.
In process only; bounded (``max_examples`` small, a deadline, no database, derandomized).

Cost, measured 2026-12-04 at load ~3: this file and its twin (test_record_fuzz.py / test_trace_fuzz.py,
80 records and 100 traces per test) take 9 s of CPU together, pytest's start included.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import torchscalpel.report.analyze_terminal as analyze_terminal
from helpers import COMMITTED_TRACES
from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.fileio import finite_json
from torchscalpel.report.html import write_analysis_html
from torchscalpel.trace import analyze_traces

SOURCE = COMMITTED_TRACES / "gpu_2rank" / "rank-0.json.gz"
TRACE = json.loads(gzip.decompress(SOURCE.read_bytes()))
EVENTS = len(TRACE["traceEvents"])
EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "s")
ARG_KEYS = ("External id", "correlation", "device", "stream", "Total Allocated", "Bytes", "Input Dims")


def _header_places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in the trace's header (``deviceProperties[0].name``, ``distributedInfo.rank``, ...) and the
    event list itself."""
    out = [path] if path else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += [(*path, "traceEvents")] if key == "traceEvents" else _header_places(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _header_places(item, (*path, i))
    return out


HEADER_PLACES = _header_places(TRACE)

BOUNDED = settings(
    max_examples=int(os.environ.get("SCALPEL_FUZZ_EXAMPLES", "100")),
    deadline=None,  # wall time depends on machine load; a hang is pytest-timeout's
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)

WRONG = st.one_of(
    st.sampled_from(
        [
            "x",
            "\ud800",
            "",
            -1,
            0,
            True,
            None,
            [],
            {},
            [None],
            float("nan"),
            float("inf"),
            1e308,
            10**30,
            2**64,
        ]
    ),
    st.text(max_size=6),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(), max_size=3),
)


def _analyse(path: Path, out: Path) -> None:
    """What ``scalpel analyze TRACE --html --json`` does with one file; a refusal must be one sentence."""
    try:
        result = analyze_traces(path, top=10)
        data = result.to_dict()
        analyze_terminal.render(data, top=10)
        write_analysis_html(finite_json(data), out / "analysis.html")
        json.dumps(finite_json(data), allow_nan=False, default=float)
    except (UsageError, ScalpelError) as exc:
        message = str(exc)
        assert message and "\n" not in message and "Traceback" not in message, message


def _write(out: Path, text: bytes, gz: bool) -> Path:
    path = out / ("trace.json.gz" if gz else "trace.json")
    path.write_bytes(gzip.compress(text, mtime=0) if gz else text)
    return path


def test_the_committed_trace_analyses(tmp_path: Path) -> None:
    result = analyze_traces(SOURCE, top=10)
    assert not result.errors and result.to_dict()["ranks"][0]["events"] == EVENTS


def _mutated(place: tuple[Any, ...], value: Any) -> bytes:
    data = json.loads(json.dumps(TRACE))
    holder = data
    for part in place[:-1]:
        if part == "args" and not isinstance(holder.get("args"), dict):
            holder["args"] = {}
        holder = holder[part]
    holder[place[-1]] = value
    return json.dumps(data).encode("utf-8", "surrogatepass")


@BOUNDED
@given(place=st.sampled_from(HEADER_PLACES), value=WRONG, gz=st.booleans())
def test_a_trace_with_a_wrong_header_value_is_analysed_or_refused_in_one_sentence(
    place: tuple[Any, ...], value: Any, gz: bool, tmp_path_factory: Any
) -> None:
    out = tmp_path_factory.mktemp("t")
    _analyse(_write(out, _mutated(place, value), gz), out)


@BOUNDED
@given(
    place=st.one_of(
        st.tuples(st.just("traceEvents"), st.integers(0, EVENTS - 1), st.sampled_from(EVENT_KEYS)),
        st.tuples(
            st.just("traceEvents"), st.integers(0, EVENTS - 1), st.just("args"), st.sampled_from(ARG_KEYS)
        ),
    ),
    value=WRONG,
    gz=st.booleans(),
)
def test_a_trace_with_a_wrong_event_value_is_analysed_or_refused_in_one_sentence(
    place: tuple[Any, ...], value: Any, gz: bool, tmp_path_factory: Any
) -> None:
    out = tmp_path_factory.mktemp("t")
    _analyse(_write(out, _mutated(place, value), gz), out)


@BOUNDED
@given(
    cut=st.floats(0.0, 1.0),
    flips=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 255)), max_size=3),
    form=st.sampled_from(["plain", "gzip", "gzip stream"]),
)
def test_a_cut_or_damaged_trace_is_analysed_in_part_or_refused_in_one_sentence(
    cut: float, flips: list[tuple[float, int]], form: str, tmp_path_factory: Any
) -> None:
    out = tmp_path_factory.mktemp("t")
    plain = json.dumps(TRACE).encode()
    # "gzip stream": the compressed bytes themselves cut and flipped (a damaged download), else the JSON text
    text = bytearray(gzip.compress(plain, mtime=0) if form == "gzip stream" else plain)
    for at, byte in flips:
        text[int(at * (len(text) - 1))] = byte
    body = bytes(text[: max(1, int(cut * len(text)))])
    if form == "gzip stream":
        path = out / "trace.json.gz"
        path.write_bytes(body)
        _analyse(path, out)
    else:
        _analyse(_write(out, body, form == "gzip"), out)

"""Fuzzing of record loading (issue 41, items 2 and 5): a real record of each stage (tests/data/records/, written
by profile, doctor, tune, lr, batch, memory and plan) with one value replaced by a wrong type, a huge or
non-finite number, a lone surrogate or a deep nesting goes through ``load_record``, every renderer that reads a
record (the HTML page, the terminal summaries, ``compare`` in both forms) and ``scalpel fix``'s checked reader:
it is refused in one sentence (:class:`UsageError` / :class:`ScalpelError`) or it renders; nothing else may
escape. In process only; bounded (``max_examples`` small, a deadline, no database, derandomized).

Cost, measured 2026-12-04 at load ~3: this file and its twin (test_record_fuzz.py / test_trace_fuzz.py,
80 records and 100 traces per test) take 9 s of CPU together, pytest's start included.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rich.console import Console

from torchscalpel.compare.core import compare_records
from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.fix.record_values import check_record
from torchscalpel.record import RunRecord, load_record
from torchscalpel.report import (
    batch_terminal,
    compare_page,
    compare_terminal,
    lr_terminal,
    memory_terminal,
    profile_terminal,
    tune_terminal,
)
from torchscalpel.report.html import record_page
from torchscalpel.sections import BatchSection, LrSection, MemorySection, TuneSection

RECORDS = Path(__file__).resolve().parents[1] / "data" / "records"
KINDS = ("profile", "doctor", "tune", "lr", "batch", "memory", "plan")
PARTS = ("summary", "profiler", "config", "sections", "findings", "steps", "environment", "provenance")
"""The parts a renderer or fix reads (the schema's own top-level fields are covered by test_record_hostile)."""

BOUNDED = settings(
    # SCALPEL_FUZZ_EXAMPLES=500 for a longer hunt by hand; CI keeps the small bound
    max_examples=int(os.environ.get("SCALPEL_FUZZ_EXAMPLES", "80")),
    deadline=None,  # wall time depends on machine load (one example renders two pages); a hang is pytest-timeout's
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _data(kind: str) -> dict[str, Any]:
    return json.loads((RECORDS / f"{kind}.json").read_text(encoding="utf-8"))


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in ``value`` (the first 3 items of a list: its rows share a shape)."""
    if path:
        yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):
            yield from _paths(item, (*path, i))


PLACES = {
    kind: [p for p in _paths(_data(kind)) if p[0] in PARTS and p[:2] != ("steps", "extra")] for kind in KINDS
}
OWN = {
    "profile": (("summary",), ("profiler",), ("sections", "trace"), ("environment", "cpu"), ("provenance",)),
    "doctor": (("findings",), ("sections", "doctor"), ("sections", "sites")),
    "tune": (("sections", "tune"),),
    "lr": (("sections", "lr"),),
    "batch": (("sections", "batch"),),
    "memory": (("sections", "memory"),),
    "plan": (("sections", "plan"),),
}
OWN_PLACES = {kind: [p for p in PLACES[kind] if any(p[: len(o)] == o for o in OWN[kind])] for kind in KINDS}
"""Half the draws land in the stage's own section (what its renderers read; the schema of steps and top-level
fields never covered it), half anywhere a renderer or fix reads."""


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


WRONG = st.one_of(
    # most draws are the type confusions and out-of-range values a reader trips on; the rest are free
    st.sampled_from(["x", None, [], {}, -1, True, float("nan")]),
    st.sampled_from(
        [
            "x",
            "\ud800",
            "",
            -1,
            -1.5,
            0,
            True,
            None,
            [],
            {},
            [None],
            {"a": "x"},
            float("nan"),
            float("inf"),
            -float("inf"),
            1e308,
            10**30,
            2**63,
            _deep(40),
        ]
    ),
    st.text(max_size=8),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.one_of(st.none(), st.integers(), st.floats()), max_size=3),
)
"""What a hostile or damaged record puts where a value was."""


def _mutated(kind: str, place: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = _data(kind)
    holder = data
    for key in place[:-1]:
        holder = holder[key]
    holder[place[-1]] = value
    return data


def _write(path: Path, data: dict[str, Any]) -> Path:
    # json.dumps writes NaN / Infinity (as torchscalpel's own writer may) and a lone surrogate as \ud800
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def render_everything(record: RunRecord, base: RunRecord, where: Path) -> None:
    """Every renderer that reads a loaded record, and fix's checked reader."""
    out = Console(file=io.StringIO(), width=100)
    record_page(record)
    profile_terminal.render(record, where, out)
    lr = record.section(LrSection)
    if lr is not None:
        lr_terminal.render(lr)
    batch = record.section(BatchSection)
    if batch is not None:
        batch_terminal.render(batch)
    memory = record.section(MemorySection)
    if memory is not None:
        memory_terminal.render(memory)
    tune = record.section(TuneSection)
    if tune is not None:
        tune_terminal.render(tune, out_dir=where, config_path=None, out=out, environment=record.environment)
    check_record(record)  # RecordValueError is a UsageError: a refusal in one sentence
    cmp = compare_records([base, record], ["base", "fuzzed"])
    compare_terminal.render(cmp, out)
    compare_page.render(cmp)


def _one_sentence(exc: BaseException) -> None:
    message = str(exc)
    assert message and "\n" not in message and "Traceback" not in message, message
    assert len(message) < 600, message


@pytest.mark.parametrize("kind", KINDS)
def test_a_real_record_of_each_stage_loads_and_renders(kind: str, tmp_path: Path) -> None:
    record = load_record(RECORDS / f"{kind}.json")
    render_everything(record, record, tmp_path)


@pytest.mark.broken_record("each example writes a damaged run.json on purpose")
@pytest.mark.parametrize("kind", KINDS)
def test_a_mutated_record_is_refused_in_one_sentence_or_renders(kind: str, tmp_path: Path) -> None:
    base = load_record(RECORDS / f"{kind}.json")

    @BOUNDED
    @given(place=st.sampled_from(PLACES[kind]) | st.sampled_from(OWN_PLACES[kind]), value=WRONG)
    def check(place: tuple[Any, ...], value: Any) -> None:
        path = _write(tmp_path / "run.json", _mutated(kind, place, value))
        try:
            record = load_record(path)
        except (UsageError, ScalpelError) as exc:
            _one_sentence(exc)
            return
        try:
            render_everything(record, base, tmp_path)
        except (UsageError, ScalpelError) as exc:
            _one_sentence(exc)

    check()


@pytest.mark.broken_record("each case writes a damaged run.json on purpose")
def test_a_value_that_passes_the_check_of_load_is_within_its_declared_range(tmp_path: Path) -> None:
    # The fuzz above could pass with a renderer that tolerates anything; this pins what load itself refuses.
    cases = [
        ("batch", ("sections", "batch", "rows", 1, "samples_per_s"), "x"),
        ("batch", ("sections", "batch", "rows", 0, "median_step_ms"), -1),
        ("batch", ("sections", "batch", "rows", 0, "batch_size"), None),
        ("lr", ("sections", "lr", "points", 1, "loss"), "1.0"),
        ("lr", ("sections", "lr", "steps"), "x"),
        ("memory", ("sections", "memory", "peak", "by_category"), None),
        ("memory", ("sections", "memory", "peak", "total"), math.inf),
        ("tune", ("sections", "tune", "winner", "confirm_pairs", 1), [1.0]),
        ("plan", ("sections", "plan", "rows", 0, "fits"), "yes"),
        ("doctor", ("sections", "sites", "forward", "device"), []),
        ("doctor", ("sections", "doctor", "counts", "warning"), 1.5),
        ("profile", ("summary", "samples_per_s"), -3.0),
        ("profile", ("sections", "trace", "top_ops", 0, "self_us"), "fast"),
    ]
    for kind, place, value in cases:
        path = _write(tmp_path / "run.json", _mutated(kind, place, value))
        with pytest.raises(UsageError) as info:
            load_record(path)
        _one_sentence(info.value)
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in place).lstrip(".")
        assert f"is not a valid run record: {field} must be " in str(info.value), info.value

"""Hostile records (issue 30, item 4): ``load_record`` refuses each malformed ``run.json`` in one sentence
naming the field (exit 2 through ``scalpel report`` and ``scalpel compare``), and the renderers draw a
large legal record at a bounded size (names clipped, at most ``charts.MAX_DRAWN`` steps drawn).

Sizes and counts are asserted, never times. The files come from tests/unit/hostile_records.py.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from hostile_records import (
    LONG_NAME,
    MANY_STEPS,
    REFUSED,
    long_name_record,
    many_steps_record,
    valid_record,
    write,
)
from rich.console import Console

from torchscalpel.cli.main import main
from torchscalpel.compare.core import compare_records
from torchscalpel.errors import UsageError
from torchscalpel.record import load_record
from torchscalpel.report import charts, compare_page, compare_terminal
from torchscalpel.report.html import record_page
from torchscalpel.report.names import NAME_LIMIT


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_load_record_refuses_in_one_sentence_naming_the_field(case, tmp_path: Path) -> None:
    _, make, word = case
    path = write(tmp_path / "run.json", make())
    with pytest.raises(UsageError) as info:
        load_record(path)
    message = str(info.value)
    assert word in message, message
    assert "\n" not in message and len(message) < 400, message


@pytest.mark.parametrize("command", ["report", "compare"])
@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_report_and_compare_exit_2_with_one_line(
    command: str, case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, make, word = case
    bad = write(tmp_path / "bad" / "run.json", make())
    good = write(tmp_path / "good" / "run.json", json.dumps(valid_record()))
    argv = [command, str(bad)] if command == "report" else [command, str(good.parent), str(bad.parent)]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
    assert word in err
    assert not (tmp_path / "bad" / "report.html").exists()


def test_a_valid_record_still_loads_with_every_field(tmp_path: Path) -> None:
    data = valid_record()
    data["provenance"] = {"code": {"git": None}}
    data["future_key"] = {"kept": [1, 2]}
    record = load_record(write(tmp_path / "run.json", json.dumps(data)))
    assert len(record.steps) == 6 and record.extra == {"future_key": {"kept": [1, 2]}}


def test_a_long_name_loads_and_is_clipped_wherever_it_is_drawn(tmp_path: Path) -> None:
    record = load_record(write(tmp_path / "a" / "run.json", long_name_record()))
    assert len(record.name) == LONG_NAME  # kept whole in the record: only the drawing is clipped
    base = load_record(write(tmp_path / "b" / "run.json", json.dumps(valid_record())))
    html = record_page(record)
    cmp = compare_records([base, record], ["b", "a"])
    out = io.StringIO()
    compare_terminal.render(cmp, Console(file=out, width=100))
    page = compare_page.render(cmp)
    for text in (html, out.getvalue(), page):
        longest = max(len(m) for m in re.findall(r"N+", text))
        assert longest <= NAME_LIMIT, longest
        assert len(text) < 200_000


def test_a_rich_markup_name_is_printed_as_text(tmp_path: Path) -> None:
    data = valid_record()
    data["name"] = "[/bold] [link=x]"
    record = load_record(write(tmp_path / "run.json", json.dumps(data)))
    cmp = compare_records([record, record], ["a", "b"])
    out = io.StringIO()
    compare_terminal.render(cmp, Console(file=out, width=200))
    assert "[/bold] [link=x]" in out.getvalue()


def test_many_steps_are_drawn_downsampled(tmp_path: Path) -> None:
    record = load_record(write(tmp_path / "a" / "run.json", many_steps_record()))
    assert len(record.steps) == MANY_STEPS
    html = record_page(record)
    # one stacked bar per drawn step, one rect per non-zero phase (5): at most MAX_DRAWN steps drawn
    assert html.count("<rect") <= 5 * charts.MAX_DRAWN + 50, html.count("<rect")
    assert f"of {MANY_STEPS - 2:,} bars drawn" in html
    assert len(html) < 2_000_000, len(html)
    base = load_record(write(tmp_path / "b" / "run.json", json.dumps(valid_record())))
    cmp = compare_records([base, record], ["b", "a"])
    page = compare_page.render(cmp)
    assert f"of {MANY_STEPS:,} points drawn" in page
    assert len(page) < 1_000_000, len(page)


def test_drawn_indices_keep_the_ends_and_stay_under_the_cap() -> None:
    for n in (1, 999, 1000, 1001, 12_345, 800_000):
        keep = list(charts.drawn_indices(n))
        assert keep[0] == 0 and keep[-1] == n - 1
        assert len(keep) <= charts.MAX_DRAWN
        assert keep == sorted(set(keep))

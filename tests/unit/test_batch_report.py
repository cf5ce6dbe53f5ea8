"""scalpel batch's HTML section reads sections["batch"] through BatchSection: the samples/s bars, the table
(a size that did not fit says why), the best size and the lr advice, and it leads the page as a verdict."""

from __future__ import annotations

from pathlib import Path

import torchscalpel.report.batch_terminal as batch_terminal
from torchscalpel.record import RunRecord
from torchscalpel.report.batch_sections import build
from torchscalpel.report.html import write_report
from torchscalpel.sections import BatchSection
from torchscalpel.tune.batch_finder import best_size, scaling_advice


def _record() -> RunRecord:
    """What stages.batch.run stores for --sizes 8,32,128,512 on an SGD script with batch 32."""
    rows = [
        {"batch_size": 8, "fits": True, "samples_per_s": 542.0, "median_step_ms": 14.8, "why": ""},
        {"batch_size": 32, "fits": True, "samples_per_s": 1145.0, "median_step_ms": 27.9, "why": ""},
        {"batch_size": 128, "fits": True, "samples_per_s": 1659.0, "median_step_ms": 77.2, "why": ""},
        {
            "batch_size": 512,
            "fits": False,
            "samples_per_s": None,
            "median_step_ms": None,
            "why": "RuntimeError: out of memory",
        },
    ]
    best = best_size(rows)
    record = RunRecord(name="batch")
    record.sections["batch"] = {
        "sizes": [8, 32, 128, 512],
        "steps": 5,
        "warmup": 2,
        "rows": rows,
        "best": best,
        "script_batch_size": 32,
        "optimizer": "SGD",
        "advice": scaling_advice("SGD", 32, best),
        "loaders_untouched": 1,
    }
    return record


def test_the_section_charts_and_tables_every_size_and_names_the_best() -> None:
    (section,) = build(_record())
    body = section.body
    assert section.id == "batch"
    assert "Best samples/s at batch <b>128</b> (the script&#x27;s own: 32)" in body
    assert (
        'data-chart="batch-samples-per-s"' in body and body.count("<rect") == 3
    )  # one bar per measured size
    assert (
        '<td class="">128 (best)</td>' in body and "1659.0" in body and ">100%<" in body and ">33%<" in body
    )
    assert "does not fit" in body and "RuntimeError: out of memory" in body
    assert "scale the lr linearly with the batch: x4 for 32 -&gt; 128" in body and "not applied" in body
    assert "1 DataLoader(s) built with a batch_sampler" in body


def test_no_size_measured_says_so_and_a_record_without_batch_has_no_section() -> None:
    record = _record()
    for row in record.sections["batch"]["rows"]:
        row.update(fits=False, samples_per_s=None, why="exit code 1")
    record.sections["batch"]["best"] = None
    (section,) = build(record)
    assert "No size was measured" in section.body and "<rect" not in section.body
    assert build(RunRecord(name="plain")) == []


def test_the_page_leads_with_the_batch_verdict(tmp_path: Path) -> None:
    write_report(_record(), tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert 'id="batch"' in page and "Batch size: samples/s" in page


def test_a_size_that_was_not_set_is_not_measured_not_a_misfit() -> None:
    record = _record()
    rows = record.sections["batch"]["rows"]
    rows[0].update(
        fits=None, samples_per_s=None, median_step_ms=None, why="not measured: the script built no DataLoader"
    )
    (section,) = build(record)
    assert '<td class="">8</td><td class="num">not measured</td>' in section.body
    assert section.body.count("<rect") == 2 and "not measured: the script built no DataLoader" in section.body
    lines = batch_terminal.render(record.section(BatchSection))  # type: ignore[arg-type]
    assert "      8  not measured: the script built no DataLoader" in lines
    assert not any(line.startswith("      8  does not fit") for line in lines)

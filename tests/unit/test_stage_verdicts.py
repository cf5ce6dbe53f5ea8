"""Verdicts that answer the user's question, and output that reads right where it lands (issue 42): memory on a
healthy script, lr against the script's own lr, plan on a CPU machine, a page of several records, the
profile page's next step by stage and by where the run came from, the notebook's scoped styles, piped output
without padding."""

from __future__ import annotations

import io
import re
import sys
from types import SimpleNamespace

import pytest

from torchscalpel.console import UnpaddedWriter, make_console
from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.report import lr_terminal, memory_terminal
from torchscalpel.report.html import (
    _CSS,
    RecordGroup,
    inline_summary,
    render_records,
    scope_css,
    sections_for,
)
from torchscalpel.report.plan_terminal import cpu_note
from torchscalpel.report.profile_sections import profile_next
from torchscalpel.runtime.summary import summarize
from torchscalpel.sections import LrSection, MemorySection

MIB = 2**20


def _memory(**extra: object) -> MemorySection:
    section: dict[str, object] = {
        "device": "cpu",
        "limit": None,
        "capacity": 1024 * MIB,
        "peak": {"total": 24 * MIB, "by_category": {}},
        "growth": {"steps": 18, "per_step": 0, "sites": []},
    }
    section.update(extra)
    return MemorySection.from_dict(section)


def test_a_healthy_memory_run_says_stable_with_its_headroom_and_what_to_run_next() -> None:
    section = _memory()
    said = section.verdict
    assert said == (
        "verdict: stable, no growth over 18 step ends; peak 24.0 MiB, headroom 1000.0 MiB of 1.00 GiB "
        "(host RAM, a CPU run)"
    )
    assert memory_terminal.render(section)[0] == said  # the verdict comes first
    assert section.next_step("train.py", "runs/m").startswith("next: scalpel tune -- train.py")


def test_memory_verdicts_for_growth_a_limit_too_few_steps_and_a_crossing() -> None:
    growing = _memory(growth={"steps": 10, "per_step": 2 * MIB, "steps_left": 7, "capacity": 40 * MIB})
    assert "grows 2.0 MiB per step, 7 more steps until 40.0 MiB: a leak to fix" in str(growing.verdict)
    assert "growing line(s)" in growing.next_step("t.py", "r")
    reached = _memory(growth={"steps": 10, "per_step": 2 * MIB, "steps_left": 0, "capacity": 40 * MIB})
    assert "grows 2.0 MiB per step, it reached 40.0 MiB in this run: a leak to fix" in str(reached.verdict)
    assert "memory grows 2.0 MiB per step: it reached 40.0 MiB in this run" in memory_terminal.render(reached)
    limited = _memory(limit=40 * MIB)
    assert "headroom 16.0 MiB of 40.0 MiB (the --memory-limit)" in str(limited.verdict)
    short = _memory(growth={"steps": 2, "note": "2 step end(s) measured; growth needs 4 or more"})
    assert "growth not judged (2 step end(s) measured" in str(short.verdict)
    crossed = _memory(oom={"request": {}, "live": 40 * MIB})
    assert crossed.verdict is None  # the headline says it ran out
    assert crossed.next_step("t.py", "runs/m").startswith("next: scalpel fix runs/m --verify")


def _lr(**extra: object) -> LrSection:
    base: dict[str, object] = {
        "min_over_10": {"lr": 0.0739, "step": 80, "min_lr": 0.739, "smoothed": 1.2},
        "suggestion": {"lr": 0.739, "step": 85, "smoothed": 1.26, "slope": -1.0},
        "script_lrs": [0.01],
    }
    base.update(extra)
    return LrSection.from_dict(base)


@pytest.mark.parametrize(
    ("own", "words"),
    [
        ([0.01], "verdict: use lr 0.0739 (minimum / 10): 7.39x the script's own 0.01; raise it"),
        ([0.5], "verdict: use lr 0.0739 (minimum / 10): 1/6.77 of the script's own 0.5; lower it"),
        ([0.05], "verdict: use lr 0.0739 (minimum / 10): about the script's own 0.05 (1.5x); keep it"),
        ([], "verdict: use lr 0.0739 (minimum / 10); the script's own lr was not seen"),
    ],
)
def test_lr_says_which_lr_to_use_against_the_scripts_own(own: list[float], words: str) -> None:
    section = _lr(script_lrs=own)
    assert lr_terminal.render(section)[0] == words
    assert "set the script's lr to 0.0739" in lr_terminal.next_line(section, "train.py")


def test_lr_without_a_suggestion_has_no_verdict_and_says_to_give_the_sweep_its_steps() -> None:
    section = _lr(min_over_10=None, suggestion=None, not_measured="the script ended first")
    assert lr_terminal.verdict_line(section) is None
    assert not lr_terminal.render(section)[0].startswith("verdict")
    assert lr_terminal.next_line(section, "t.py").startswith("next: give the sweep its steps")
    steepest = _lr(min_over_10=None)
    assert lr_terminal.verdict_line(steepest).startswith("verdict: use lr 0.739 (steepest descent)")  # type: ignore[union-attr]


def test_a_plan_against_host_ram_says_so_and_how_to_plan_for_a_gpu() -> None:
    def result(kind: str) -> object:
        return SimpleNamespace(request=SimpleNamespace(device=SimpleNamespace(kind=kind)))

    (note,) = cpu_note(result("cpu"))  # type: ignore[arg-type]
    assert "this machine's RAM" in note and "--device A100-80GB" in note and "--device-memory" in note
    assert cpu_note(result("cuda")) == []  # type: ignore[arg-type]


def _profiled(**target: str) -> RunRecord:
    r = RunRecord(name="t", status="complete", target=dict(target) or {"script": "train.py"})
    r.steps = [
        StepRecord(
            index=i,
            total_ms=10.0,
            data_ms=0.5,
            forward_ms=2.0,
            backward_ms=6.0,
            optimizer_ms=1.0,
            other_ms=0.5,
        )
        for i in range(6)
    ]
    r.summary = summarize(r)
    return r


def test_the_profile_pages_next_step_fits_the_stage_and_where_the_run_came_from() -> None:
    assert "scalpel doctor -- train.py" in profile_next(_profiled())
    notebook = profile_next(_profiled(inprocess="Cell In[3], line 25"))
    assert "torchscalpel.doctor()" in notebook and "scalpel doctor" not in notebook
    memory = _profiled()
    memory.sections["memory"] = _memory().to_dict()
    assert profile_next(memory) == ""  # memory's own verdict says what is next
    page = "".join(s.body for s in sections_for(memory))
    assert "Next: <code>scalpel doctor" not in page
    assert (
        "<b>Stable, no growth over 18 step ends; peak 24.0 MiB" in page
        and "Next: scalpel tune -- train.py" in page
    )


def test_a_page_of_several_records_opens_with_a_summary_of_them() -> None:
    a, b = _profiled(), _profiled()
    b.name = "second"
    page = render_records([RecordGroup(record=a), RecordGroup(record=b)], title="t", subtitle="")
    first = re.search(r'<section id="([^"]+)"', page)
    assert first and first.group(1) == "summary"
    summary = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    assert 'href="#record-1"' in summary and 'href="#record-2"' in summary and "second" in summary
    assert "The median step takes 10.00 ms" in summary  # each record's verdict, first sentence
    assert 'id="record-2"' in page


def test_the_notebook_styles_touch_only_torchscalpels_own_output() -> None:
    scoped = scope_css(_CSS, ".s")
    for rule in filter(None, scoped.split("}")):
        for selector in rule.split("{", 1)[0].split(","):
            assert selector == ".s" or selector.startswith(".s "), selector
    assert ".s th,.s td{" in scoped  # "th,td" was ".scalpel-inline th,td": every td of the notebook
    html = inline_summary(_profiled(inprocess="Cell In[1], line 3"))
    style = html.split("<style>", 1)[1].split("</style>", 1)[0]
    assert not re.search(r"(^|[},])\s*(td|th|table|pre|h2)\b", style), style


def test_piped_output_is_never_padded(monkeypatch: pytest.MonkeyPatch) -> None:
    sink = io.StringIO()
    monkeypatch.setattr(sys, "stdout", sink)
    writer = UnpaddedWriter()
    writer.write("a   ")
    writer.write("b  \nc ")
    writer.write("\n  d\n")
    assert sink.getvalue() == "a   b\nc\n  d\n"
    monkeypatch.delenv("COLUMNS", raising=False)
    sink.truncate(0), sink.seek(0)
    console = make_console()
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column()
    grid.add_column()
    grid.add_row("short", "x")
    grid.add_row("a much longer label", "y" * 150)
    console.print(grid)
    lines = sink.getvalue().splitlines()
    assert lines and all(line == line.rstrip() for line in lines), lines
    assert lines[0] == "short                x"


def test_a_notebooks_evaluation_note_names_the_functions_argument_not_the_cli_flag() -> None:
    from torchscalpel.memory.analysis import evaluation_seen

    obs = SimpleNamespace(evaluations=0, tracker=SimpleNamespace(oom=None))
    steps = [SimpleNamespace()] * 3
    cell = SimpleNamespace(status="stopped", steps=steps, target={"inprocess": "Cell In[2], line 4"})
    note = evaluation_seen(obs, cell, "forward")["note"]  # type: ignore[arg-type]
    assert "torchscalpel.memory(steps=None)" in note and "--until-eval" not in note
    script = SimpleNamespace(status="stopped", steps=steps, target={"script": "train.py"})
    assert "--until-eval" in evaluation_seen(obs, script, "forward")["note"]  # type: ignore[arg-type]


def test_a_memory_section_whose_analysis_failed_is_not_called_stable() -> None:
    """The analysis never computed growth: "stable, no growth" would be a guess (the measured peak still shows)."""
    section = MemorySection.from_dict(
        {"error": "analysis failed: RuntimeError('bug')", "peak": {"total": 2**20}, "samples": []}
    )
    assert (
        section.verdict
        == "verdict: not judged: analysis failed: RuntimeError('bug'); what was measured follows"
    )
    assert memory_terminal.render(section)[0].startswith("verdict: not judged") and "stable" not in "\n".join(
        memory_terminal.render(section)
    )

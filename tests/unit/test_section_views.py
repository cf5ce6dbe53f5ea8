"""Every record section with a renderer has a typed view that refuses a wrong-typed field; renderers read views,
never ``record.sections[...]``; a verdict is said once and the terminal and the page say the same words; tune's
terminal is drawn from its saved section, and piped it keeps one whole row per variant (issue 38, issue 42)."""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import torchscalpel.report.lr_terminal as lr_terminal
import torchscalpel.report.memory_terminal as memory_terminal
import torchscalpel.report.tune_terminal as tune_terminal
from torchscalpel.console import make_console
from torchscalpel.record import RunRecord, load_record, save_record
from torchscalpel.report import lr_sections, memory_sections, tune_sections
from torchscalpel.sections import (
    SECTION_CHECKS,
    TRIAL_STATUSES,
    TRIAL_VERDICTS,
    BatchSection,
    LrSection,
    MemorySection,
    StageSection,
    TuneSection,
    check_section,
)
from torchscalpel.tune.result import TuneResult
from torchscalpel.tune.runner import TrialResult
from torchscalpel.tune.states import TrialStatus, Verdict

REPORT = Path(__file__).resolve().parents[2] / "src" / "torchscalpel" / "report"
MIB = 2**20
MEMORY: dict[str, Any] = {
    "version": "1.0",
    "device": "cpu",
    "limit": None,
    "capacity": 1024 * MIB,
    "peak": {"total": 24 * MIB, "step": 3, "phase": "backward", "op": "aten.mm", "by_category": {}},
    "growth": {"steps": 18, "per_step": 0, "sites": []},
    "samples": [{"step": 1, "by_category": {"parameters": MIB}}],
}


def test_every_stage_view_is_the_check_of_its_section() -> None:
    views = {cls.KEY: cls for cls in _subclasses(StageSection)}
    assert {"memory", "tune", "lr", "batch"} <= set(views)
    for key, cls in views.items():
        assert SECTION_CHECKS[key] == cls.problem, key  # the record's load check is the view's own


@pytest.mark.parametrize(
    ("key", "data", "refused"),
    [
        ("memory", {**MEMORY, "limit": "40MiB"}, "sections.memory.limit must be a byte count"),
        ("memory", {**MEMORY, "device": 3}, "sections.memory.device must be a string"),
        ("memory", {**MEMORY, "peak": None}, "sections.memory.peak must be an object"),
        (
            "memory",
            {**MEMORY, "growth": {"per_step": "x"}},
            "sections.memory.growth.per_step must be a finite",
        ),
        (
            "memory",
            {**MEMORY, "oom": {"request": {}}},
            "sections.memory.top_cause must be an object with a text",
        ),
        ("tune", {"trials": [{"label": "a", "median_ms": "x"}]}, "sections.tune.trials[0].median_ms must be"),
        ("tune", {"noise": "loud"}, "sections.tune.noise must be"),
        ("lr", {"points": "many"}, "sections.lr.points must be a list"),
        ("lr", {"script_lrs": [0.1, "x"]}, "sections.lr.script_lrs[1] must be"),
        ("batch", {"rows": [{"batch_size": "32"}]}, "sections.batch.rows[0].batch_size must be"),
    ],
)
def test_each_view_refuses_a_wrong_typed_field(key: str, data: dict[str, Any], refused: str) -> None:
    problem = check_section(key, data)
    assert problem is not None and problem.startswith(refused), problem


def test_the_views_pass_what_their_writers_write() -> None:
    assert check_section("memory", MEMORY) is None
    assert (
        check_section("memory", {"error": "analysis failed: x", "oom": {"request": {}}}) is None
    )  # no cause
    assert check_section("tune", _tune_result(3).to_dict()) is None


def test_no_renderer_reads_the_raw_sections_dict() -> None:
    """A renderer reads ``record.section(View)``: indexing ``record.sections`` (or ``.get`` on it) is the raw
    dict a view exists to replace."""
    found = [
        f"{path.name}:{line}"
        for path in sorted(REPORT.glob("*.py"))
        for line in _raw_reads(path.read_text("utf-8"))
    ]
    assert not found, found
    assert _raw_reads("m = record.sections.get('memory')\nt = record.sections['tune']") == [1, 2]  # it bites


def _raw_reads(source: str) -> list[int]:
    """Lines of ``source`` that index ``X.sections`` or call ``X.sections.get``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        inner = node.value if isinstance(node, ast.Subscript) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            inner = node.func.value
        if isinstance(inner, ast.Attribute) and inner.attr == "sections":
            lines.append(node.lineno)
    return sorted(lines)


def test_the_memory_verdict_is_said_once_and_the_terminal_and_page_say_it() -> None:
    record = RunRecord(sections={"memory": dict(MEMORY)}, target={"script": "train.py"})
    view = record.section(MemorySection)
    assert view is not None and view.verdict is not None and view.verdict.startswith("verdict: stable")
    assert memory_terminal.render(view)[0] == view.verdict
    body = memory_sections.build(record)[0].body
    said = view.verdict.removeprefix("verdict: ")
    assert f"<b>{said[:1].upper() + said[1:]}.</b>" in body.replace("&#x27;", "'")
    assert view.next_step("train.py", "RUN_DIR")[1:] in body  # the page's next step is the view's too
    # the renderers hold no verdict prose of their own
    for module in (memory_terminal, memory_sections):
        source = Path(module.__file__ or "").read_text(encoding="utf-8")
        assert "stable, no growth" not in source and "a leak to fix" not in source


def test_the_lr_verdict_on_the_page_is_the_terminals() -> None:
    points = [
        {"step": i, "lr": 10 ** (-5 + i / 10), "loss": 3 - i / 40, "smoothed": 3 - i / 40} for i in range(40)
    ]
    data = {
        "points": points,
        "min_over_10": {"lr": 0.0739, "step": 39, "min_lr": 0.739, "smoothed": 2.0},
        "suggestion": {"lr": 0.739, "step": 35, "smoothed": 2.1, "slope": -1.0},
        "script_lrs": [0.01],
    }
    record = RunRecord(sections={"lr": data})
    view = record.section(LrSection)
    assert view is not None
    said = lr_terminal.verdict_line(view)
    assert said == "verdict: use lr 0.0739 (minimum / 10): 7.39x the script's own 0.01; raise it"
    assert said == lr_terminal.render(view)[0]
    assert said.replace("'", "&#x27;") in lr_sections.build(record)[0].body


def _trial(label: str, ms: float, verdict: Verdict, **extra: Any) -> TrialResult:
    family = label.split("(")[0].split("=")[0]
    return TrialResult(
        label=label,
        settings={},
        family=family,
        status=TrialStatus.OK,
        median_ms=ms,
        baseline_ms=100.0,
        speedup=100.0 / ms,
        speedup_pair=[100.0, ms],
        verdict=verdict,
        **extra,
    )


def _tune_result(n: int) -> TuneResult:
    """A search of ``n`` compile variants, each with a long result note (graph breaks, recompiles) and a winner."""
    breaks = [
        {
            "where": f"model.py:{40 + i}",
            "reason": "call_function BuiltinVariable(print) [ConstantVariable] {}",
        }
        for i in range(3)
    ]
    trials = [
        _trial(
            f"compile(mode={'max-autotune' if i % 2 else 'default'}, dynamic={bool(i % 3)}) #{i:02d}",
            100.0 - i,
            Verdict.NOT_FASTER,
            reason="compute-bound: most of the step is matmuls that compile fuses with their neighbours",
            reason_short="compute-bound: fusion",
            note="screened and not faster than the required speedup over the noise of the baseline runs",
            compile={
                "compile_ms": 12000.0 + i,
                "breaks": breaks,
                "recompile_guards": [{"guard": "size"}] * 2,
            },
        )
        for i in range(n - 1)
    ]
    winner = _trial(
        "compile + amp=bf16",
        70.0,
        Verdict.WINNER,
        confirm_pairs=[[100.0, 70.0], [101.0, 70.5], [99.0, 71.0]],
        confirm_ratios=[100 / 70, 101 / 70.5, 99 / 71],
    )
    baseline = TrialResult(label="baseline", settings={}, median_ms=100.0, verdict=Verdict.BASELINE)
    return TuneResult(
        baseline=baseline,
        trials=[*trials, winner],
        winner=winner,
        confirmed_speedup=100 / 70,
        noise=0.02,
        baseline_medians=[100.0, 101.0, 99.0],
        notes=[
            "plan: "
            + "the search ended after 16 runs (was 20): compile variants were cut by the budget; " * 5
        ],
    )


def _rendered(tune: TuneSection, out: Console, tmp_path: Path) -> None:
    tune_terminal.render(
        tune, out_dir=tmp_path, config_path=tmp_path / "scalpel.toml", out=out, target_text="train.py"
    )


def test_tune_terminal_from_a_saved_run_json_is_the_live_one(tmp_path: Path) -> None:
    result = _tune_result(5)
    live = RunRecord(sections={"tune": result.to_dict()})
    save_record(live, tmp_path / "run.json")
    texts = []
    for record in (live, load_record(tmp_path)):
        view = record.section(TuneSection)
        assert view is not None
        console = Console(record=True, width=200)
        _rendered(view, console, tmp_path)
        texts.append(console.export_text())
    assert texts[0] == texts[1]
    said = (
        f"recommended: compile + amp=bf16: {100 / 70:.2f}x faster per step"  # the confirmation's median pair
    )
    assert said in texts[0]
    assert said.removeprefix("recommended: ") in tune_sections.build(live)[0].body  # the page's headline too


def test_a_piped_tune_of_14_variants_keeps_one_whole_row_each_and_no_line_over_the_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 42: piped to a CI log the table was 200 columns with text wrapped inside cells (14 variants, 76
    lines; ``grep compile`` found only first lines) and ``plan:`` lines reached 321 characters."""
    monkeypatch.delenv("COLUMNS", raising=False)
    result = _tune_result(14)
    out = make_console()
    assert out.soft_wrap and not out.is_terminal  # what a pipe gets
    _rendered(TuneSection.from_dict(result.to_dict()), out, tmp_path)
    text = capsys.readouterr().out
    lines = text.splitlines()
    too_long = [line for line in lines if len(line) > out.width and str(tmp_path) not in line]
    assert not too_long, too_long
    for trial in result.ranked():
        cells = tune_terminal.row_cells(trial)
        rows = [line for line in lines if line.startswith(f"│ {trial.label} ")]  # the table's row of LABEL
        assert len(rows) == 1, (trial.label, rows)  # one line, never a cell wrapped onto a second
        assert all(cell in rows[0] for cell in cells[:10]), (cells, rows[0])  # every figure in it, whole
    notes = [line for line in lines if re.match(r"\[\d+\] ", line)]
    first = next(line for line in lines if "compile(mode=" in line)
    assert notes and re.search(r"│ \[\d+\] +│", first), first  # long notes as footnotes
    assert any("recompile(s): size; size" in line for line in lines)  # the footnote keeps the whole note
    grep = [line for line in lines if re.search(r"compile(\(| \+)", line) and "│" in line]
    assert len(grep) == len(result.ranked()) - 1 == 14  # every compile variant's row, each on one line


def test_a_table_whose_notes_fit_keeps_them_in_their_cells(tmp_path: Path) -> None:
    result = _tune_result(2)
    buf = io.StringIO()
    _rendered(TuneSection.from_dict(result.to_dict()), Console(file=buf, width=1000), tmp_path)
    text = buf.getvalue()
    assert not re.search(r"^\[\d+\] ", text, re.M)  # no footnote needed
    assert "recompile(s): size; size" in next(line for line in text.splitlines() if "compile(mode=" in line)


def test_a_view_of_a_batch_section_reads_its_rows() -> None:
    view = BatchSection.from_dict({"rows": [{"batch_size": 32, "fits": True}], "best": 32})
    assert view.rows[0]["batch_size"] == 32 and view.best == 32


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def test_the_trial_vocabularies_a_record_is_checked_against_are_tunes_own() -> None:
    assert {v.value for v in Verdict} == TRIAL_VERDICTS
    assert {s.value for s in TrialStatus} <= TRIAL_STATUSES
    for value in TRIAL_STATUSES:
        TrialStatus.parse(value)  # every spelling the check lets through reads back (older ones included)
    assert check_section("tune", {"trials": [{"label": "a", "verdict": "great"}]}) is not None
    assert check_section("tune", {"trials": [{"label": "a", "compile": {"breaks": "x"}}]}) is not None

"""What tune leaves behind: scalpel.toml (never over a user's file), code.txt, run.json, report.html."""

from __future__ import annotations

import json
from pathlib import Path

from test_tune_search import FakeRunner

from torchscalpel.record import RunRecord
from torchscalpel.report.tune_sections import build
from torchscalpel.runtime.target import Target
from torchscalpel.sections import TuneSection
from torchscalpel.stages.demo import tune_options
from torchscalpel.stages.tune import run as tune_stage_run
from torchscalpel.tune import search as search_mod
from torchscalpel.tune.options import SilentProgress
from torchscalpel.tune.settings import TuneSettings, read_settings_file


def _demo_tune(out: Path):
    """The demo's short tune through the tune stage, silent; the search's result."""
    options = tune_options(Target(script=Path("train.py")), out, budget_s=60)
    return tune_stage_run(options, progress=SilentProgress()).search


def test_tune_stage_writes_every_output(monkeypatch, tmp_path):
    monkeypatch.setattr(search_mod, "run_trial", FakeRunner({"amp=bf16 + amp_fp32_attention": 60.0}))
    out = tmp_path / "demo-tune"
    result = _demo_tune(out)
    assert result.winner is not None
    assert read_settings_file(out / "scalpel.toml") == TuneSettings(amp="bf16", amp_fp32_attention=True)
    assert "torch.autocast" in (out / "code.txt").read_text()
    data = json.loads((out / "run.json").read_text())
    assert data["sections"]["tune"]["winner"]["label"] == "amp=bf16 + amp_fp32_attention"
    html = (out / "report.html").read_text()
    assert "Tune: recommendation" in html and "scalpel run --config scalpel.toml" in html


def test_user_config_is_never_overwritten(monkeypatch, tmp_path):
    from torchscalpel.stages.tune import save_outputs
    from torchscalpel.tune.search import TuneOptions, tune

    monkeypatch.setattr(search_mod, "run_trial", FakeRunner({"amp=bf16 + amp_fp32_attention": 60.0}))
    result = tune(Target(script=Path("t.py")), TuneOptions(out_dir=tmp_path / "o", knobs=("amp",), steps=3))
    mine = tmp_path / "scalpel.toml"
    mine.write_text("[tune]\nthreads = 3\n")  # hand-written: no "written by scalpel tune" mark
    paths = save_outputs(result, tmp_path / "o", config_path=mine, command=[], target_text="t.py")
    assert "config" not in paths and mine.read_text() == "[tune]\nthreads = 3\n"
    ours = tmp_path / "ours.toml"
    save_outputs(result, tmp_path / "o", config_path=ours, command=[], target_text="t.py")
    save_outputs(result, tmp_path / "o", config_path=ours, command=[], target_text="t.py")  # ours: replaced
    assert read_settings_file(ours).amp == "bf16"


def test_report_sections_only_with_a_tune_result():
    assert build(RunRecord()) == []


def test_report_sections_show_no_change(monkeypatch, tmp_path):
    from torchscalpel.tune.search import TuneOptions, tune

    monkeypatch.setattr(search_mod, "run_trial", FakeRunner({}))
    result = tune(Target(script=Path("t.py")), TuneOptions(out_dir=tmp_path, knobs=("amp",), steps=3))
    sections = build(RunRecord(sections={"tune": result.to_dict()}))
    assert [s.id for s in sections] == ["tune", "tune-variants", "tune-losses"]
    assert "No change recommended" in sections[0].body
    assert "not faster" in sections[1].body and "<svg" in sections[2].body


def test_the_recommendation_says_how_many_pairs_confirmed_it_and_warns_below_three(monkeypatch, tmp_path):
    from rich.console import Console

    import torchscalpel.report.tune_terminal as tune_terminal

    monkeypatch.setattr(search_mod, "run_trial", FakeRunner({"amp=bf16 + amp_fp32_attention": 60.0}))
    result = _demo_tune(tmp_path / "t")
    assert result.winner is not None
    for pairs, warned in (
        ([[160.0, 100.0]], True),
        ([[160.0, 100.0], [160.0, 100.0], [170.0, 100.0]], False),
    ):
        result.winner.confirm_pairs = pairs
        console = Console(record=True, width=200)
        tune_terminal.render(
            TuneSection.from_dict(result.to_dict()),
            out_dir=tmp_path,
            config_path=tmp_path / "scalpel.toml",
            out=console,
        )
        text = console.export_text()
        assert f"1.60x faster per step than the baseline ({len(pairs)} interleaved pair" in text
        assert ("re-measure with --confirm 3" in text) is warned


def test_tune_result_at_80_columns_keeps_every_figure_whole_and_code_parseable(monkeypatch, tmp_path):
    """The issue's 80x45 tmux: the table collapsed to 1-4 character columns (step ms "4"), the why and
    result columns vanished, and the equivalent code wrapped into invalid Python."""
    import ast
    import io
    import re
    import textwrap

    from rich.console import Console

    import torchscalpel.report.tune_terminal as tune_terminal
    from torchscalpel.report.tune_terminal import row_cells
    from torchscalpel.tune.apply import code_lines

    monkeypatch.setattr(search_mod, "run_trial", FakeRunner({"amp=bf16 + amp_fp32_attention": 60.0}))
    result = _demo_tune(tmp_path / "t")
    assert result.winner is not None
    buf = io.StringIO()
    out = Console(file=buf, width=80)  # as piped with COLUMNS=80, and as an 80-column terminal
    tune_terminal.render(
        TuneSection.from_dict(result.to_dict()),
        out_dir=tmp_path / "t",
        config_path=tmp_path / "t" / "scalpel.toml",
        out=out,
    )
    text = buf.getvalue()
    lines = text.splitlines()
    # every row's figures appear whole, on one line with their name
    for trial in result.ranked():
        cells = row_cells(trial)
        assert trial.label in text
        for name, value in (("step ms", cells[1]), ("speedup", cells[3])):
            if value != "-":
                assert any(f"{name} {value}" in line for line in lines), (name, value, text)
    # the equivalent code fits (a terminal cuts a longer line anywhere) and is the same code: comments moved
    # above their line, long calls broken inside their brackets
    start = next(i for i, line in enumerate(lines) if line.startswith("equivalent code")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("settings:"))
    printed = lines[start:end]
    assert all(len(line) <= 80 for line in printed), printed
    same = ast.parse("\n".join(code_lines(result.settings)))
    assert ast.dump(ast.parse(textwrap.dedent("\n".join(printed)))) == ast.dump(same)
    for line in lines[:start] + lines[end:]:
        if str(tmp_path) in line:  # a path is never wrapped (soft wrap): a copy of it must still work
            continue
        assert len(line) <= 80, line
        assert not re.search(r"\d…|…\d", line), line  # no number cut by an ellipsis


def test_tune_says_when_the_machine_was_busy_as_profile_does(monkeypatch, tmp_path):
    # a tune run at load 13 on 2 cores printed its speedups with no word about the load (issue 31)
    from rich.console import Console

    import torchscalpel.report.tune_terminal as tune_terminal
    from torchscalpel.report.tune_terminal import busy_note

    def facts(load, cores=2):
        return {"cpu": {"load_avg_1m": load, "usable_cores": cores}}

    # env's rule: the load less the run itself at or above the usable cores
    assert busy_note(facts(13.0)) and "load 13.0 on 2 cores" in busy_note(facts(13.0))
    assert busy_note(facts(3.0)) and busy_note(facts(9.0, cores=8))
    assert busy_note(facts(2.9)) is None and busy_note(facts(8.5, cores=8)) is None
    assert busy_note(facts(None)) is None and busy_note({}) is None and busy_note(None) is None

    monkeypatch.setattr(search_mod, "run_trial", FakeRunner({"amp=bf16 + amp_fp32_attention": 60.0}))
    result = _demo_tune(tmp_path / "t")
    for environment, said in ((facts(13.0), True), (facts(0.5), False)):
        console = Console(record=True, width=200)
        tune_terminal.render(
            TuneSection.from_dict(result.to_dict()),
            out_dir=tmp_path,
            config_path=tmp_path / "c.toml",
            out=console,
            environment=environment,
        )
        text = console.export_text()
        assert ("This machine is busy (load 13.0 on 2 cores)" in text) is said
        assert ("measured at that load" in text) is said

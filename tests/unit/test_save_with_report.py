"""Every stage saves run.json before it renders: a renderer that raises costs the page, never the record."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from torchscalpel.record import RunRecord


def _boom(record: RunRecord, path: Path) -> Path:
    raise RuntimeError("renderer exploded")


def _direct(record: RunRecord, out: Path) -> None:
    from torchscalpel.stages.saving import save_with_report

    assert save_with_report(record, out) is None


def _profile(record: RunRecord, out: Path) -> None:
    from torchscalpel.stages.profile import finish_profile

    finish_profile(record, out, quiet=True)


def _memory(record: RunRecord, out: Path) -> None:
    from torchscalpel.stages.memory import finish

    finish(record, out, json_path=None, write_report=True)


@pytest.mark.parametrize("stage", [_direct, _profile, _memory], ids=lambda f: f.__name__.strip("_"))
def test_a_raising_renderer_leaves_run_json(
    stage: Callable[[RunRecord, Path], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torchscalpel.report.html as html

    monkeypatch.setattr(html, "write_report", _boom)
    out = tmp_path / "run"
    stage(RunRecord(name="kept", status="complete", exit_code=0), out)
    saved = json.loads((out / "run.json").read_text())
    assert saved["name"] == "kept"
    assert saved["artifacts"]["record"] == "run.json" and "report" not in saved["artifacts"]
    assert any("report.html failed: RuntimeError('renderer exploded')" in n for n in saved["notes"])
    assert not (out / "report.html").exists()


def test_a_working_renderer_is_named_in_the_record(tmp_path: Path) -> None:
    from torchscalpel.stages.saving import save_with_report

    written = save_with_report(RunRecord(name="r", status="complete", exit_code=0), tmp_path)
    assert written == tmp_path / "report.html" and written.is_file()
    assert json.loads((tmp_path / "run.json").read_text())["artifacts"]["report"] == "report.html"

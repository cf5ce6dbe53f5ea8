"""A launch's one page: `scalpel report OUT/launch.json` (it said "not written by torchscalpel"), with the
verdict (the hang, the straggler) first and the ranks side by side."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torchscalpel.cli.main import main
from torchscalpel.distributed.rankmerge import merge
from torchscalpel.record import RunRecord, StepRecord


def _rank(ms: float) -> RunRecord:
    r = RunRecord(name="train", status="complete")
    r.steps = [StepRecord(index=i, total_ms=ms + (i % 3) * 0.1, data_ms=0.5) for i in range(8)]
    return r


def _launch_folder(tmp_path: Path) -> Path:
    merged = merge({0: _rank(10.0), 1: _rank(30.0)})
    hang = {
        "rule": "rank-hang",
        "severity": "error",
        "message": "the job hung: rank 1 waits in all_reduce, rank 0 left the loop",
        "evidence": ["no progress for 60 s (timeout 60 s)"],
        "fix": "Look at the diverging rank's line in hang.txt.",
        "ranks": [0, 1],
    }
    merged["findings"] = [hang, *merged["findings"]]
    out = tmp_path / "launch"
    out.mkdir()
    (out / "launch.json").write_text(json.dumps(merged, default=str))
    return out


def test_scalpel_report_renders_a_launch_summary_verdict_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _launch_folder(tmp_path)
    for given in (folder / "launch.json", folder):
        page_path = tmp_path / "launch.html"
        assert main(["report", str(given), "--out", str(page_path)]) == 0, capsys.readouterr().err
        page = page_path.read_text()
        ids = re.findall(r'<section id="([^"]+)"', page)
        assert ids[0] == "verdict" and "ranks" in ids
        verdict = page.split('<section id="verdict">', 1)[1].split("</section>", 1)[0]
        assert "the job hung: rank 1 waits in all_reduce" in verdict and "Straggler:" in verdict
        assert "<script" not in page and not re.search(r"(src|href)=\"https?://", page)
    assert "launch summary" in capsys.readouterr().out


def test_a_launch_writes_its_page_beside_launch_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchscalpel.record import save_record
    from torchscalpel.report.launch_terminal import render
    from torchscalpel.stages.launch import report_ranks

    for rank, ms in ((0, 10.0), (1, 10.2)):
        folder = tmp_path / f"rank-{rank}"
        folder.mkdir()
        save_record(_rank(ms), folder)
    report = report_ranks(tmp_path)
    assert capsys.readouterr().out == ""  # the stage prints nothing; its renderer says where the page is
    render(report)
    assert f"page: {tmp_path / 'launch.html'}" in capsys.readouterr().out
    page = (tmp_path / "launch.html").read_text()
    assert re.findall(r'<section id="([^"]+)"', page)[:2] == ["verdict", "ranks"]
    assert "2 rank(s) wrote a record; status complete" in page

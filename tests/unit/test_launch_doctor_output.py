"""What a multi-rank doctor prints (``scalpel launch --doctor``, ``scalpel doctor --nproc``): one true
statement about the findings, never a rank's "No findings." above the launcher's cross-rank ones.

L0: the renderer and the reading of the launcher's files; the launches themselves are in
test_rank_rules.py (which also checks their terminal output)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from torchscalpel.doctor.ranks import across_rank_findings
from torchscalpel.findings import Finding, Severity
from torchscalpel.report.doctor_terminal import render_rank_findings


def _text(across: list[Finding], per_rank: list[Finding], ranks: int = 2) -> str:
    console = Console(width=200, record=True, color_system=None)
    with console.capture() as cap:
        render_rank_findings(across, per_rank, console, ranks=ranks)
    return cap.get()


def _f(rule: str, severity: Severity = Severity.WARNING, rank: int | None = None) -> Finding:
    return Finding(rule=rule, severity=severity, message=f"{rule} happened", evidence=[], fix="", rank=rank)


def test_no_findings_is_said_once_and_only_when_there_are_none_at_all():
    text = _text([], [], ranks=4)
    assert text.count("No findings") == 1 and "on any of the 4 rank(s), nor across them" in text


def test_cross_rank_findings_are_not_under_a_no_findings_line():
    text = _text([_f("identical-random-streams")], [])
    assert "No findings" not in text
    assert text.index("across ranks") < text.index("identical-random-streams") < text.index("per rank: none")


def test_both_groups_are_labelled_and_the_launchers_come_first_in_their_order():
    across = [_f("global-batch", Severity.INFO), _f("collective-mismatch", Severity.ERROR)]
    text = _text(across, [_f("zero-grad-missing", rank=1)])
    assert "No findings" not in text
    # the launcher's order is kept (the hang watch's findings explain the rest); then each rank's own
    assert (
        text.index("global-batch")
        < text.index("collective-mismatch")
        < text.index("per rank")
        < text.index("zero-grad-missing")
    )
    assert "(rank 1)" in text


def test_across_rank_findings_read_the_watch_and_the_facts(tmp_path: Path):
    hang = {
        "summary": "rank 1 is in barrier #3 from t.py:9; rank 0 is in all_reduce #3 from t.py:8",
        "idle_s": 6.1,
        "hang_timeout_s": 6,
        "diverging_ranks": [1],
        "ranks": {"0": {}, "1": {}},
    }
    (tmp_path / "hang.json").write_text(json.dumps(hang))
    (tmp_path / "watch").mkdir()
    found = across_rank_findings(tmp_path)
    assert [(f.rule, f.rank) for f in found] == [("rank-hang", 1)]
    assert found[0].message.startswith("the job hung: rank 1 is in barrier #3")
    assert across_rank_findings(tmp_path / "nothing-here") == []

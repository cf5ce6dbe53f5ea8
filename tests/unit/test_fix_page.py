"""The fix record (fix.json) and the fix page: what fix writes is what the page reads back, a mark of the wrong
shape is not drawn, the verdict says verified / not verified / NOT verified with the verification's figures, and
a fixed run's report shows the fix after the stage's own verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchscalpel.fix.measured import MARK_FILE, read_mark
from torchscalpel.fix.stage import FixResult, Item, mark_result
from torchscalpel.fix.verify import Start, Verification
from torchscalpel.record import RunRecord
from torchscalpel.report import fix_sections
from torchscalpel.report.html import record_page_with, sections_for

BEFORE = "import torch\nmodel = torch.load(p, weights_only=False)\n"
AFTER = "import torch\nmodel.load_state_dict(torch.load(p, weights_only=True))\n"


def _result(tmp_path: Path, verification: Verification | None = None) -> tuple[FixResult, Path]:
    script = tmp_path / "train.py"
    script.write_text(BEFORE, encoding="utf-8")
    run_dir = tmp_path / "doctor"
    run_dir.mkdir()
    record = RunRecord(name="doctor", command=["scalpel", "doctor", "--", "train.py"])
    record.sections["doctor"] = {"findings": []}
    items = [
        Item("unsafe-torch-load", "doctor", "patched", where="train.py:2", rule="unsafe-torch-load"),
        Item("grad clipping <b>", "doctor", "not patched", reason="no clip call", rule="x"),
    ]
    result = FixResult(
        patch="# scalpel fix: header\n--- a/train.py\n+++ b/train.py\n@@ -1,2 +1,2 @@\n-old <line>\n+new line\n",
        items=items,
        root=tmp_path,
        changes={script: (BEFORE, AFTER)},
        records=[(run_dir, record)],
        verification=verification,
    )
    return result, run_dir


def test_what_fix_writes_in_fix_json_is_what_the_page_reads_back(tmp_path: Path) -> None:
    result, run_dir = _result(tmp_path)
    mark_result(result)
    data = json.loads((run_dir / MARK_FILE).read_text(encoding="utf-8"))
    assert set(data["files"]) == {str(tmp_path / "train.py")}  # what a later fix reads is still there
    mark = read_mark(run_dir)
    assert mark is not None and mark.patch == result.patch and mark.applied is False
    assert [(i.label, i.status, i.where) for i in mark.items] == [
        ("unsafe-torch-load", "patched", "train.py:2"),
        ("grad clipping <b>", "not patched", ""),
    ]
    assert mark.runs[0].folder == str(run_dir)
    assert mark.runs[0].lines[0].startswith(f"run: {run_dir} (doctor, torch ")
    assert "findings fixed: unsafe-torch-load" in mark.runs[0].lines
    assert mark.verified is None and mark.verification == ()


def test_a_verified_fix_keeps_the_verifications_figures(tmp_path: Path) -> None:
    check = Verification(starts=[Start(rc=0)], losses="losses: largest relative deviation 0.0e+00", ok=True)
    result, run_dir = _result(tmp_path, check)
    result.applied = True
    mark_result(result)
    mark = read_mark(run_dir)
    assert mark is not None and mark.verified is True and mark.applied is True
    assert mark.verification == tuple(check.lines())
    sections = fix_sections.build(mark, folder="doctor")
    verdict = sections[0]
    assert verdict.id == "fix"
    assert "1 change patched in 1 file, written to your files; verified" in verdict.body
    assert "losses: largest relative deviation 0.0e+00" in verdict.body and "--verify" not in verdict.body


@pytest.mark.parametrize(
    ("ok", "said", "not_said"),
    [(None, "not verified (--verify", "NOT verified"), (False, "NOT verified", "; verified")],
)
def test_the_verdict_says_when_a_fix_is_not_verified(
    tmp_path: Path, ok: bool | None, said: str, not_said: str
) -> None:
    check = None if ok is None else Verification(starts=[Start(rc=1, error=["    boom"])], ok=False)
    result, run_dir = _result(tmp_path, check)
    mark_result(result)
    mark = read_mark(run_dir)
    assert mark is not None
    body = fix_sections.build(mark, folder="runs/doctor")[0].body
    assert said in body and not_said not in body
    if ok is None:  # the next step names the run folder
        assert "<code>scalpel fix runs/doctor --verify</code>" in body
    else:  # a failed start's own lines sit under it, as code
        assert "<pre>boom</pre>" in body


def test_the_page_escapes_what_the_record_says_and_colours_the_diff(tmp_path: Path) -> None:
    result, run_dir = _result(tmp_path)
    mark_result(result)
    mark = read_mark(run_dir)
    assert mark is not None
    html = fix_sections.page(mark, folder=str(run_dir))
    assert "grad clipping &lt;b&gt;" in html and "<b>" not in html.split("grad clipping", 1)[1][:20]
    assert (
        "-old &lt;line&gt;" in html and 'color:#912018">-old' in html and 'color:#05603a">+new line' in html
    )
    # the verdict leads, then what the patch came from, then the diff
    ids = [s.id for s in fix_sections.build(mark)]
    assert ids == ["fix", "fix-measured", "fix-diff"]


@pytest.mark.parametrize(
    "bad",
    [
        {"files": {}},  # a mark written before the fix record existed: no page
        {
            "files": {},
            "patch": "",
            "made": "t",
            "applied": "yes",
            "items": [],
            "runs": [],
            "verification": None,
        },
        {"files": {}, "patch": "", "made": "t", "applied": False, "items": [{"label": 1}], "runs": []},
        {"patch": "", "made": "t", "applied": False, "items": [], "runs": [{"folder": "x", "lines": [3]}]},
        {"patch": "", "made": "t", "applied": False, "items": [], "runs": [], "verification": {"ok": 1}},
        [1, 2],
    ],
)
def test_a_fix_json_of_another_shape_is_not_drawn(tmp_path: Path, bad: object) -> None:
    (tmp_path / MARK_FILE).write_text(json.dumps(bad), encoding="utf-8")
    assert read_mark(tmp_path) is None
    assert fix_sections.sections_in(tmp_path) == []
    (tmp_path / MARK_FILE).write_text("{not json", encoding="utf-8")
    assert read_mark(tmp_path) is None


def test_a_fixed_runs_report_shows_the_fix_after_the_stages_own_verdict(tmp_path: Path) -> None:
    result, run_dir = _result(tmp_path)
    mark_result(result)
    record = RunRecord(name="doctor", command=["scalpel", "doctor"])
    record.sections["doctor"] = {"findings": []}
    (run_dir / "run.json").write_text("{}", encoding="utf-8")
    extra = fix_sections.sections_in(run_dir / "run.json")  # a run.json names its folder
    assert [s.id for s in extra] == ["fix", "fix-measured", "fix-diff"]
    html = record_page_with(record, extra)
    ids = [part.split('"', 1)[0] for part in html.split('<section id="')[1:]]
    assert ids[0] == sections_for(record)[0].id != "fix"  # the stage's own verdict still leads
    assert ids.index("fix") < ids.index("fix-measured") < ids.index("fix-diff")


def test_write_pages_writes_fix_html_only_beside_a_fix_record(tmp_path: Path) -> None:
    result, run_dir = _result(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    assert fix_sections.write_pages([run_dir, other]) == []  # no fix.json yet: no page
    mark_result(result)
    written = fix_sections.write_pages([run_dir, other])
    assert written == [run_dir / fix_sections.PAGE_FILE]
    assert "torchscalpel · fix" in written[0].read_text(encoding="utf-8")

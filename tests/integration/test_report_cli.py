"""``scalpel report``: any Run record(s) into one HTML page; bad input is one sentence and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import run_cli
from torchscalpel.findings import Finding, Severity
from torchscalpel.record import new_run_record, save_record

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"


@pytest.fixture(scope="module")
def profile_run(tmp_path_factory) -> Path:
    """A record written by 'scalpel profile' on a tiny script (shared by the tests of this module)."""
    out = tmp_path_factory.mktemp("report") / "profiled"
    proc = run_cli(
        "profile",
        "--out",
        str(out),
        "--warmup",
        "1",
        "--steps",
        "3",
        "--profile-steps",
        "0",
        "--",
        str(SCRIPTS / "epoch_loop.py"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _doctor_like_record(folder: Path) -> Path:
    record = new_run_record("checked", status="complete", target={"script": "train.py"})
    record.findings = [
        Finding(
            rule="grads-never-zeroed",
            severity=Severity.ERROR,
            message="Gradients pile up",
            fix="optimizer.zero_grad()",
        ).to_dict()
    ]
    record.sections["doctor"] = {"counts": {"error": 1}}
    save_record(record, folder)
    return folder


def test_one_profile_record_renders_into_its_folder(profile_run):
    (profile_run / "report.html").unlink()
    proc = run_cli("report", str(profile_run))
    assert proc.returncode == 0, proc.stderr
    html = (profile_run / "report.html").read_text()
    assert 'id="steps"' in html and 'data-chart="step-breakdown"' in html
    assert "<script" not in html


def test_two_records_become_one_page_with_a_group_each(profile_run, tmp_path):
    doctor = _doctor_like_record(tmp_path / "doctor")
    out = tmp_path / "both.html"
    proc = run_cli("report", str(profile_run / "run.json"), str(doctor), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert 'id="record-1"' in html and 'id="record-2"' in html
    assert "profile · epoch_loop" in html and "doctor · checked" in html
    assert html.index('id="steps"') < html.index('id="record-2"') < html.index('id="findings"')
    assert "grads-never-zeroed" in html
    ids = [part.split('"', 1)[0] for part in html.split(' id="')[1:]]
    assert len(ids) == len(set(ids))


def test_several_records_default_to_the_current_folder(profile_run, tmp_path):
    doctor = _doctor_like_record(tmp_path / "doctor")
    proc = run_cli("report", str(profile_run), str(doctor), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "scalpel-report.html").is_file()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "No run record at"),
        ("{not json", "is not valid JSON"),
        ('{"schema_version": "1.0", "python": {}}', "is not a run record"),
        ('{"schema_version": "9.0", "name": "x", "status": "complete"}', "schema version 9.0, newer than"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(tmp_path, content, needle):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    proc = run_cli("report", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scalpel: error: ") and needle in lines[0], proc.stderr
    assert str(path) in lines[0]
    assert not (tmp_path / "report.html").exists()


def test_out_must_be_an_html_file(tmp_path):
    folder = _doctor_like_record(tmp_path / "doctor")
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    proc = run_cli("report", str(folder), "--out", str(keep))
    assert proc.returncode == 2 and "is not an .html file" in proc.stderr
    assert keep.read_text() == "mine"
    proc = run_cli("report", str(folder), "--out", str(tmp_path))
    assert proc.returncode == 2 and "is a folder" in proc.stderr


def test_record_kind_names_what_wrote_a_record():
    from torchscalpel.report.html import record_kind

    record = new_run_record("x")
    assert record_kind(record) == "record"
    record.command = ["scalpel", "profile", "--", "train.py"]
    assert record_kind(record) == "profile"
    record.sections["plan"] = {}
    assert record_kind(record) == "plan"

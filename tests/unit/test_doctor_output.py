"""Doctor output: JSON document, SARIF log, terminal ranking, --fail-on threshold, report section."""

from __future__ import annotations

import io

from rich.console import Console

import torchscalpel.report.doctor_terminal as doctor_terminal
from torchscalpel.doctor.sarif import to_sarif
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.record import RunRecord
from torchscalpel.report.doctor_terminal import reaches, to_json
from torchscalpel.report.findings_sections import build

FINDINGS = [
    Finding(
        rule="unseeded-run",
        severity=Severity.INFO,
        message="no seed",
        source="static",
        location=Location(file="a.py", line=3),
    ),
    Finding(
        rule="grad-not-zeroed",
        severity=Severity.ERROR,
        message="grads pile up",
        evidence=["5 of 5 steps"],
        fix="optimizer.zero_grad()",
    ),
    Finding(
        rule="dataparallel-used",
        severity=Severity.WARNING,
        message="use DDP",
        source="static",
        location=Location(file="b.py", line=7, column=5),
    ),
]


def test_json_is_ranked_and_carries_rule_slugs() -> None:
    data = to_json(FINDINGS, mode="run")
    assert [f["rule"] for f in data["findings"]] == ["grad-not-zeroed", "dataparallel-used", "unseeded-run"]
    assert data["counts"] == {"error": 1, "warning": 1, "info": 1} and data["mode"] == "run"


def test_fail_on_threshold() -> None:
    assert reaches(FINDINGS, Severity.ERROR)
    assert not reaches(FINDINGS[:1], Severity.WARNING)
    assert reaches(FINDINGS[:1], Severity.INFO)
    assert not reaches(FINDINGS, None)


def test_sarif_has_rules_results_levels_and_regions(tmp_path) -> None:
    log = to_sarif([f for f in FINDINGS if f.location], version="0.1.0", base=tmp_path)
    assert log["version"] == "2.1.0" and "sarif" in log["$schema"]
    results = log["runs"][0]["results"]
    assert {r["level"] for r in results} == {"note", "warning"}
    dp = next(r for r in results if r["ruleId"] == "dataparallel-used")
    assert dp["locations"][0]["physicalLocation"]["region"] == {"startLine": 7, "startColumn": 5}
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert rules[dp["ruleIndex"]]["id"] == "dataparallel-used"


def test_terminal_lists_most_severe_first_with_fix_and_location() -> None:
    buf = io.StringIO()
    doctor_terminal.render(FINDINGS, Console(file=buf, width=120, color_system=None))
    text = buf.getvalue()
    assert text.index("grad-not-zeroed") < text.index("dataparallel-used") < text.index("unseeded-run")
    assert "optimizer.zero_grad()" in text and "b.py:7" in text and "3 finding(s)" in text
    assert "1 error(s) found" in text


def test_summary_line_says_when_errors_were_found() -> None:
    from torchscalpel.report.doctor_terminal import summary_line

    assert "2 error(s) found" in summary_line(
        [FINDINGS[1], FINDINGS[1]]
    ) and "they are fixed" in summary_line(FINDINGS[1:2] * 2)
    assert "error(s) found" not in summary_line(FINDINGS[2:]) and "0 error, 1 warning" in summary_line(
        FINDINGS[2:]
    )
    assert "no errors or warnings" in summary_line(FINDINGS[:1])


def test_report_section_lists_findings_and_escapes_html() -> None:
    record = RunRecord(
        findings=[Finding(rule="nan-loss", severity=Severity.ERROR, message="<b>nan</b>").to_dict()]
    )
    (section,) = build(record)
    assert "nan-loss" in section.body and "&lt;b&gt;" in section.body and "<b>nan</b>" not in section.body
    assert build(RunRecord()) == []
    assert "No findings" in build(RunRecord(sections={"doctor": {}}))[0].body


def test_env_findings_join_the_doctor_list(monkeypatch) -> None:
    from torchscalpel.doctor import api
    from torchscalpel.envcheck import checks

    fake = Finding(
        rule="cuda-driver-too-old", severity=Severity.ERROR, message="old driver", source="runtime"
    )
    monkeypatch.setattr(checks, "run_checks", lambda facts: [fake])
    (f,) = api._env_findings(RunRecord(environment={"python": "3.11"}))
    assert f.rule == "cuda-driver-too-old" and f.source == "env"

    def broken(facts):
        raise KeyError("driver")

    monkeypatch.setattr(checks, "run_checks", broken)
    record = RunRecord()
    assert api._env_findings(record) == [] and "environment checks failed" in record.notes[0]


def test_a_rule_the_launcher_judged_is_not_repeated_per_rank():
    from torchscalpel.findings import without_launcher_repeats

    across = [{"rule": "ddp-accumulation-without-no-sync", "source": "launch"}]
    per_rank = [
        Finding(rule="ddp-accumulation-without-no-sync", severity=Severity.WARNING, message="m"),
        Finding(rule="unseeded-run", severity=Severity.INFO, message="n"),
    ]
    assert [f.rule for f in without_launcher_repeats(across, per_rank)] == ["unseeded-run"]
    assert without_launcher_repeats([], per_rank) == per_rank


def test_a_long_fix_is_relaid_to_80_columns_and_still_parses():
    # at 80 columns rich's word wrap cut a fix line wherever the edge fell; the copy no longer parsed
    import ast
    import textwrap

    fix = (
        "with torch.autocast(device_type=device.type, dtype=torch.bfloat16):  # the forward and the loss only\n"
        "    loss = loss_fn(model(inputs, attention_mask=attention_mask, labels=labels), targets)"
    )
    buf = io.StringIO()
    doctor_terminal.render(
        [Finding(rule="amp-missing", severity=Severity.WARNING, message="m", fix=fix)],
        Console(file=buf, width=80),
    )
    lines = buf.getvalue().splitlines()
    start = lines.index("  fix:") + 1
    code = lines[start : lines.index("", start)]
    assert all(len(line.rstrip()) <= 80 for line in code), code
    assert ast.dump(ast.parse(textwrap.dedent("\n".join(line.rstrip() for line in code)))) == ast.dump(
        ast.parse(fix)
    )

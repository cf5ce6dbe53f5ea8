"""Every report page opens with its verdict: what the numbers mean and what to do next, before any chart."""

from __future__ import annotations

import re

from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.report.html import render_page, sections_for
from torchscalpel.runtime.summary import summarize


def _first_section(page: str) -> str:
    found = re.search(r'<section id="([^"]+)"', page)
    assert found, page[:500]
    return found.group(1)


def _page(record: RunRecord) -> str:
    return render_page("t", "", sections_for(record))


def _profiled() -> RunRecord:
    r = RunRecord(name="t", status="complete", target={"script": "train.py"})
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


def test_a_profile_report_opens_with_where_the_step_goes_and_what_next() -> None:
    page = _page(_profiled())
    assert _first_section(page) == "profile-verdict"
    verdict = page.split('<section id="profile-verdict">', 1)[1].split("</section>", 1)[0]
    assert "the largest part is <b>backward</b>: 6.00 ms, 60% of it" in verdict
    assert "scalpel doctor -- train.py" in verdict and "scalpel tune -- train.py" in verdict


def test_a_memory_report_opens_with_the_out_of_memory_cause_and_ladder_before_any_chart() -> None:
    r = _profiled()
    r.sections["memory"] = {
        "peak": {
            "total": 3 << 20,
            "by_category": {"activations": 3 << 20},
            "modules": [],
            "sites": [],
            "step": 4,
            "phase": "forward",
            "op": "aten.mm",
        },
        "samples": [{"step": i, "by_category": {"activations": i << 20}} for i in range(5)],
        "top_cause": {"text": "activations of the attention blocks"},
        "oom": {
            "request": {"op": "aten.mm", "site": "train.py:40", "bytes": 1 << 20},
            "live": 3 << 20,
            "limit": 4 << 20,
            "ladder": [{"action": "halve the batch", "saves": 1 << 20, "fits": True, "config": {}}],
        },
    }
    page = _page(r)
    assert _first_section(page) == "memory"
    assert page.index("Out of memory") < page.index("<svg")
    assert page.index("halve the batch") < page.index("<svg")


def test_a_doctor_report_opens_with_its_findings() -> None:
    r = _profiled()
    r.sections["doctor"] = {"findings": []}
    r.findings = [{"rule": "x", "severity": "warning", "message": "m", "evidence": [], "fix": ""}]
    assert _first_section(_page(r)) == "findings"


def test_the_compare_page_opens_with_its_verdict() -> None:
    from test_compare import make_record

    from torchscalpel.compare import compare_records
    from torchscalpel.report.compare_page import render

    page = render(compare_records([make_record(), make_record(backward_scale=1.652)]))
    assert _first_section(page) == "verdict"


def test_a_stopped_run_does_not_read_as_a_failure() -> None:
    r = _profiled()
    r.status = "stopped"
    r.config["stopped_by"] = {"kind": "steps", "reason": "stopped after the steps"}
    page = _page(r)
    assert (
        f"status <b>stopped</b>: ended after the {len(r.steps)} planned steps, as asked (not a failure"
        in page
    )


def test_a_group_heading_names_the_kind_once() -> None:
    from torchscalpel.report.html import RecordGroup, render_records

    tune = RunRecord(name="tune", status="complete", sections={"tune": {}})
    other = _profiled()
    page = render_records([RecordGroup(record=tune), RecordGroup(record=other)], title="t", subtitle="")
    heads = re.findall(r'<div class="group-head" id="[^"]+"><h2>([^<]*)</h2>', page)
    assert heads == ["tune", "profile · t"], heads


def test_the_demo_page_links_each_stages_outputs(tmp_path) -> None:
    from torchscalpel.stages.demo import StageResult, _write_combined_report

    results = [
        StageResult(
            name="env", ok=True, seconds=1.0, output=str(tmp_path / "env" / "env.json"), summary="ok"
        ),
        StageResult(name="export", ok=False, seconds=0.5, output="", summary="failed: <no bundle>"),
    ]
    page = _write_combined_report(tmp_path, results).read_text()
    assert '<td class=""><a href="env/env.json">env/env.json</a></td>' in page
    assert "failed: &lt;no bundle&gt;" in page  # every other cell is still escaped


def _analysis() -> dict:
    steps = [
        {"name": f"ProfilerStep#{i}", "dur_us": 2000.0 + 100 * i, "cpu_busy_us": 1900.0, "cpu_categories": {}}
        for i in range(3)
    ]
    return {
        "ranks": [
            {"rank": 0, "device": "cpu", "events": 10, "steps": steps, "complete": True, "path": "r.json"}
        ],
        "top_ops": [
            {"name": "aten::addmm", "self_us": 3000.0, "total_us": 3500.0, "count": 3, "category": "matmul"}
        ],
        "categories": {"matmul": 3000.0, "other": 1000.0},
    }


def test_the_analyze_page_opens_with_what_the_traces_say(tmp_path) -> None:
    from torchscalpel.report.analyze_terminal import verdict_lines
    from torchscalpel.report.html import write_analysis_html

    lines = verdict_lines(_analysis())
    assert lines[0] == (
        "1 trace, 3 profiled step(s): mean step 2.10 ms; the top CPU op is aten::addmm (75.0% of CPU op self time)"
    )
    assert lines[-1] == "next: scalpel analyze TRACE --diff OTHER (two traces compared, op by op)"
    diff = {
        "mean_step_us": {"a": 2000.0, "b": 2460.0},
        "ops": {"rows": [{"name": "aten::addmm", "status": "changed", "delta_us": 450.0}]},
    }
    said = verdict_lines(_analysis(), diff)
    assert "diff: B's mean step is 2.46 ms against A's 2.00 ms: B is 1.23x slower per step" in said
    assert "the largest change: aten::addmm (changed, +0.45 ms)" in said
    page = tmp_path / "analyze.html"
    write_analysis_html(_analysis(), page)
    assert _first_section(page.read_text(encoding="utf-8")) == "verdict"


def test_a_verdict_shows_commands_as_code_not_as_literal_backticks() -> None:
    from torchscalpel.report.page import code_spans

    assert (
        code_spans("what `scalpel tune` tries <here>") == "what <code>scalpel tune</code> tries &lt;here&gt;"
    )
    assert code_spans("an odd ` stays") == "an odd ` stays"
    page = _page(_profiled())
    verdict = page.split('<section id="profile-verdict">', 1)[1].split("</section>", 1)[0]
    assert "`" not in verdict and "<code>scalpel tune</code>" in verdict


def test_the_analyze_summary_fits_80_columns_and_keeps_lines_whole_on_a_pipe(monkeypatch) -> None:
    import torchscalpel.report.analyze_terminal as analyze_terminal

    data = _analysis()
    for s in data["ranks"][0]["steps"]:
        s["cpu_categories"] = {"elementwise": 1200.0, "reduction": 900.0, "matmul": 800.0}
    data["top_ops"][0]["name"] = "autograd::engine::evaluate_function: AddmmBackward0" * 2
    data["categories"] = {f"category{i}": 100.0 * i for i in range(1, 9)}
    monkeypatch.setenv("COLUMNS", "80")
    narrow = analyze_terminal.render(data).splitlines()
    assert max(len(line) for line in narrow) <= 80, narrow
    assert any(line.startswith("verdict: ") for line in narrow)
    monkeypatch.delenv("COLUMNS")
    piped = analyze_terminal.render(
        data
    ).splitlines()  # no COLUMNS on a pipe: each line whole, as a log keeps it
    assert any(len(line) > 80 for line in piped) and len(piped) < len(narrow)


def test_the_gpu_step_table_becomes_two_tables_at_80_columns_and_stays_one_on_a_pipe(monkeypatch) -> None:
    import torchscalpel.report.analyze_terminal as analyze_terminal

    data = _analysis()
    data["ranks"][0]["device"] = "cuda"
    fields = ("compute_us", "communication_us", "memcpy_us", "memset_us", "gpu_idle_us", "host_wait_us")
    for i, s in enumerate(data["ranks"][0]["steps"]):
        s.update({k: 1234.5 + i for k in (*fields, "kernel_wait_us", "other_wait_us")}, gpu_busy_pct=61.5)
    monkeypatch.setenv("COLUMNS", "80")
    narrow = analyze_terminal.render(data).splitlines()
    assert max(len(line) for line in narrow) <= 80, narrow
    # every step shows in both tables, each figure whole: 3 steps x (busy ... memcpy) and (memset ... other-w)
    assert sum(line.startswith("  ProfilerStep#") for line in narrow) == 6
    assert any("kern-w" in line for line in narrow) and any("busy%" in line for line in narrow)
    monkeypatch.delenv("COLUMNS")
    piped = analyze_terminal.render(data).splitlines()
    assert sum(line.startswith("  ProfilerStep#") for line in piped) == 3  # one row per step, whole
    assert any("busy%" in line and "kern-w" in line for line in piped)

"""The HTML trace sections shared by ``analyze`` and ``profile``: built from the result dict only."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from test_trace_analysis import synthetic_events

import torchscalpel.report.trace_sections as trace_sections
from helpers import COMMITTED_TRACES
from torchscalpel.report.html import render_page
from torchscalpel.report.trace_sections import build_diff_section
from torchscalpel.trace import analyze_traces
from torchscalpel.trace.diff import diff_results


def _ids(sections) -> list[str]:
    return [s.id for s in sections]


def test_sections_for_synthetic_gpu_trace_with_memory(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": synthetic_events()}, fh)
    data = analyze_traces([path]).to_dict()
    sections = trace_sections.build(data)
    assert _ids(sections) == [
        "trace-overview",
        "trace-steps",
        "trace-gpu",
        "trace-ops",
        "trace-kernels",
        "trace-memory",
    ]
    html = render_page("t", "s", sections)
    assert 'data-chart="memory-timeline"' in html and 'data-chart="steps-rank0"' in html
    assert "aten::mm" in html and "0.0 MiB" in html  # 3000 bytes peak
    memory = next(s for s in sections if s.id == "trace-memory")
    assert "aten::mm" in memory.body


def test_cpu_only_and_prefix(trace_set: Path) -> None:
    data = analyze_traces(trace_set / "cpu_only").to_dict()
    sections = trace_sections.build(data, prefix="profile-trace")
    assert _ids(sections) == ["profile-trace-overview", "profile-trace-steps", "profile-trace-ops"]
    assert "CPU only" in sections[1].body


def test_errors_section_and_escaping(tmp_path: Path, trace_set: Path) -> None:
    raw = gzip.decompress((trace_set / "gpu_2rank/rank-0.json.gz").read_bytes())
    path = tmp_path / "<b>rank-0.json"
    path.write_bytes(raw[: len(raw) // 3])
    data = analyze_traces([path]).to_dict()
    sections = trace_sections.build(data)
    err = next(s for s in sections if s.id == "trace-errors")
    assert "truncated at byte" in err.body and "<b>rank" not in err.body and "&lt;b&gt;rank" in err.body


def test_diff_section(traces_dir: Path) -> None:
    a = analyze_traces(traces_dir / "compare/base.json.gz")
    b = analyze_traces(traces_dir / "compare/test.json.gz")
    sec = build_diff_section(diff_results(a, b))
    assert sec.id == "trace-diff" and "All2All_Pooled_Req" in sec.body and "added" in sec.body


def test_diff_section_committed() -> None:
    a = analyze_traces(COMMITTED_TRACES / "compare/base.json.gz")
    b = analyze_traces(COMMITTED_TRACES / "compare/test.json.gz")
    sec = build_diff_section(diff_results(a, b))
    assert (
        sec.id == "trace-diff" and "aten::cat" in sec.body and "added" in sec.body and "changed" in sec.body
    )

"""``scalpel analyze`` end to end through the CLI (subprocess via tests/helpers.run_cli)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from helpers import COMMITTED_TRACES, run_cli


def test_two_rank_folder_json_and_html(tmp_path: Path, traces_dir: Path) -> None:
    out_json, out_html = tmp_path / "a.json", tmp_path / "a.html"
    proc = run_cli(
        "analyze",
        str(traces_dir / "gpu_2rank"),
        "--json",
        str(out_json),
        "--html",
        str(out_html),
        "--top",
        "5",
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "ProfilerStep#551" in proc.stdout
        and "straggler: not measured: rank 0 has 2, rank 1 has 2 steps" in proc.stdout
    )
    data = json.loads(out_json.read_text())
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["ranks"][0]["gpu"]["comm_comp_overlap_pct"] == 11.81
    assert data["top_ops"][0]["self_us"] >= data["top_ops"][1]["self_us"]
    html = out_html.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html
    for sid in ("trace-overview", "trace-steps", "trace-gpu", "trace-ops", "trace-kernels", "trace-ranks"):
        assert f'id="{sid}"' in html
    assert 'data-chart="steps-rank0"' in html


def test_committed_two_rank_folder_json_and_html(tmp_path: Path) -> None:
    out_json, out_html = tmp_path / "a.json", tmp_path / "a.html"
    proc = run_cli(
        "analyze", str(COMMITTED_TRACES / "gpu_2rank"), "--json", str(out_json), "--html", str(out_html)
    )
    assert proc.returncode == 0, proc.stderr
    assert "ProfilerStep#10" in proc.stdout and "likely straggler" in proc.stdout
    data = json.loads(out_json.read_text())
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert [r["gpu"]["comm_comp_overlap_pct"] for r in data["ranks"]] == [50.0, 100.0]
    assert data["stragglers"]["likely_straggler"] == 1
    html = out_html.read_text()
    for sid in ("trace-overview", "trace-steps", "trace-gpu", "trace-ops", "trace-kernels", "trace-ranks"):
        assert f'id="{sid}"' in html


def test_committed_diff_lists_added_ops(tmp_path: Path) -> None:
    out_json = tmp_path / "d.json"
    proc = run_cli(
        "analyze",
        str(COMMITTED_TRACES / "compare/base.json.gz"),
        "--diff",
        str(COMMITTED_TRACES / "compare/test.json.gz"),
        "--json",
        str(out_json),
    )
    assert proc.returncode == 0, proc.stderr
    diff = json.loads(out_json.read_text())["diff"]
    assert diff["ops"]["added"] == ["aten::cat"] and diff["ops"]["removed"] == []
    (row,) = diff["kernels"]["rows"]
    assert (row["status"], row["count_a"], row["count_b"], row["time_a_us"], row["time_b_us"]) == (
        "changed",
        1,
        3,
        80,
        240,
    )
    assert "added    aten::cat" in proc.stdout


def test_diff_lists_added_ops(tmp_path: Path, traces_dir: Path) -> None:
    out_json = tmp_path / "d.json"
    proc = run_cli(
        "analyze",
        str(traces_dir / "compare/base.json.gz"),
        "--diff",
        str(traces_dir / "compare/test.json.gz"),
        "--json",
        str(out_json),
        "--html",
        str(tmp_path / "d.html"),
    )
    assert proc.returncode == 0, proc.stderr
    diff = json.loads(out_json.read_text())["diff"]
    assert diff["ops"]["added"] == ["AddmmBackward0", "All2All_Pooled_Req", "CatBackward0"]
    assert diff["ops"]["removed"] == []
    changed = {r["name"]: r for r in diff["kernels"]["rows"] if r["status"] == "changed"}
    assert len(changed) == 1 and next(iter(changed.values()))["count_a"] == 3
    assert "added    All2All_Pooled_Req" in proc.stdout
    assert 'id="trace-diff"' in (tmp_path / "d.html").read_text()


def test_truncated_trace_exit_1_with_offset_and_partial_outputs(tmp_path: Path, trace_set: Path) -> None:
    raw = gzip.decompress((trace_set / "gpu_2rank/rank-0.json.gz").read_bytes())
    cut = tmp_path / "rank-0.json"
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    out_json = tmp_path / "p.json"
    proc = run_cli("analyze", str(cut), "--json", str(out_json))
    assert proc.returncode == 1
    assert "truncated at byte" in proc.stderr and "events could be read" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "INCOMPLETE" in proc.stdout and "top CPU ops" in proc.stdout
    data = json.loads(out_json.read_text())
    assert data["complete"] is False and data["errors"][0]["byte_offset"] > 0


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    proc = run_cli("analyze", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = run_cli("analyze", str(tmp_path))
    assert proc.returncode == 2 and "no .json or .json.gz" in proc.stderr
    proc = run_cli("analyze", str(COMMITTED_TRACES / "cpu_only"), "--json", str(tmp_path / "nope" / "x.json"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = run_cli("analyze", str(COMMITTED_TRACES / "cpu_only"), "--top", "0")
    assert proc.returncode == 2


def test_real_cpu_profiler_trace_with_memory(tmp_path: Path) -> None:
    """A trace torch.profiler writes on this machine: steps, CPU ops and the allocator peak."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    path = tmp_path / "cpu.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        schedule=schedule(wait=0, warmup=1, active=3),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(4):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            prof.step()
    out_json = tmp_path / "r.json"
    proc = run_cli("analyze", str(path), "--json", str(out_json))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out_json.read_text())
    rank = data["ranks"][0]
    assert rank["device"] == "cpu" and len(rank["steps"]) == 3
    names = {o["name"] for o in data["top_ops"]}
    assert "aten::addmm" in names
    mem = data["memory"]
    assert mem["peak_bytes"] > 32 * 256 * 4 and mem["device"] == "cpu" and mem["peak_op"]
    assert "memory: peak" in proc.stdout

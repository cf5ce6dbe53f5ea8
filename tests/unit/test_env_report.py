"""The env report dict, its JSON file, Ctrl-C during probes, and the terminal screen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from torchscalpel.envcheck import report as report_mod
from torchscalpel.envcheck.probes import ProbeResult
from torchscalpel.envcheck.report import build_report, write_json
from torchscalpel.report.env_terminal import fact_rows, render

GPU_FACTS: dict[str, Any] = {
    "python": "3.11.7",
    "executable": "/venv/bin/python",
    "os": "Linux 6.8",
    "machine": "x86_64",
    "platform": "linux",
    "cpu_count": 32,
    "cpu": {"model": "Xeon", "usable_cores": 32, "physical_cores": 16, "flags": ["avx512f"]},
    "torch": "2.8.0+cu128",
    "torch_cuda": "12.8",
    "torch_hip": None,
    "torch_threads": 16,
    "torch_build": {"kind": "cuda", "cudnn": 91002, "bf16_supported": True},
    "cuda_available": True,
    "gpus": [
        {
            "index": 0,
            "name": "NVIDIA H100",
            "memory_bytes": 80 << 30,
            "capability": "9.0",
            "multiprocessors": 132,
        }
    ],
    "driver": {
        "nvidia_version": "535.104.05",
        "cuda_version": "12.2",
        "nvidia_smi": "/usr/bin/nvidia-smi",
        "nvidia_devices": ["/dev/nvidia0"],
    },
    "distributed": {"available": True, "gloo": True, "nccl": True},
    "compilers": {"cxx": "/usr/bin/g++", "cc": "/usr/bin/gcc"},
    "packages": {"torch": "2.8.0+cu128", "triton": "3.4.0", "onnx": "1.15.0"},
    "cuda_wheels": [],
    "env": {"OMP_NUM_THREADS": "4"},
}


def _text(report: dict[str, Any]) -> str:
    console = Console(record=True, width=200, color_system=None)
    render(report, console)
    return console.export_text()


def test_report_without_probes_carries_facts_and_findings() -> None:
    rep = build_report(probes=(), facts=dict(GPU_FACTS))
    assert rep["kind"] == "scalpel-env" and rep["schema_version"] == "1.0" and rep["complete"] is True
    assert rep["probes"] == []
    rules = [f["rule"] for f in rep["findings"]]
    assert rules == ["driver-too-old-for-cuda", "onnx-vulnerable-version"]
    text = _text(rep)
    assert "Probes skipped (--no-probe)" in text
    assert "NVIDIA H100, 80 GiB, sm 9.0, 132 SMs" in text
    assert "535.104.05, supports CUDA up to 12.2" in text
    assert "WARNING driver-too-old-for-cuda" in text and "fix: Upgrade the NVIDIA driver to >= 570.26" in text
    assert "0 error(s), 2 warning(s), 0 info" in text


def test_probe_results_and_findings_in_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(names, *, timeout, compile_timeout, on_result):  # type: ignore[no-untyped-def]
        on_result(
            ProbeResult(name="compile", device="cpu", status="failed", seconds=1.0, detail="no compiler")
        )

    monkeypatch.setattr(report_mod, "run_probes", fake_run)
    rep = build_report(probes=("compile",), facts={})
    assert [p["status"] for p in rep["probes"]] == ["failed"]
    assert [f["rule"] for f in rep["findings"]] == ["probe-compile-failed"]
    assert "compile" in _text(rep) and "no compiler" in _text(rep)


def test_ctrl_c_during_probes_keeps_what_was_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(names, *, timeout, compile_timeout, on_result):  # type: ignore[no-untyped-def]
        on_result(ProbeResult(name="matmul", device="cpu", status="ok", detail="1 GFLOP/s"))
        raise KeyboardInterrupt

    monkeypatch.setattr(report_mod, "run_probes", interrupted)
    rep = build_report(probes=("matmul", "compile"), facts={})
    assert rep["complete"] is False and [p["name"] for p in rep["probes"]] == ["matmul"]
    assert "Probes interrupted" in _text(rep)


def test_write_json_round_trips_and_creates_folders(tmp_path: Path) -> None:
    rep = build_report(probes=(), facts=dict(GPU_FACTS))
    path = write_json(rep, tmp_path / "a" / "b" / "env.json")
    assert json.loads(path.read_text()) == json.loads(json.dumps(rep))
    assert [p.name for p in path.parent.iterdir()] == ["env.json"]  # no temp file left


def test_gpus_seen_only_by_nvidia_smi_are_shown() -> None:
    facts = {
        "torch_build": {"kind": "cpu"},
        "torch": "2.8.0+cpu",
        "nvidia_smi": {
            "gpus": [{"index": 0, "name": "NVIDIA A100", "memory_bytes": 40 << 30, "capability": "8.0"}],
            "driver_version": "550.54.14",
            "cuda_version": "12.4",
        },
    }
    rows = dict(fact_rows(facts))
    assert rows["GPU 0"] == "NVIDIA A100, 40 GiB, sm 8.0 (nvidia-smi; torch cannot see it)"
    assert rows["NVIDIA driver"] == "550.54.14, supports CUDA up to 12.4"
    assert "CPU-only build" in rows["torch"]


def test_environment_section_in_the_html_report() -> None:
    from torchscalpel.record import RunRecord
    from torchscalpel.report.html import sections_for

    facts = {**GPU_FACTS, "env": {"NCCL_DEBUG": "<b>INFO</b>"}}
    sections = [s for s in sections_for(RunRecord(environment=facts)) if s.id == "environment"]
    assert len(sections) == 1
    body = sections[0].body
    assert "NVIDIA H100, 80 GiB, sm 9.0" in body
    assert "&lt;b&gt;INFO&lt;/b&gt;" in body and "<b>INFO" not in body  # escaped
    assert not [s for s in sections_for(RunRecord()) if s.id == "environment"]  # no facts, no section


def test_at_80_columns_a_probe_table_that_would_wrap_its_cells_becomes_one_line_per_probe() -> None:
    probes = [
        {
            "name": "matmul",
            "device": "cpu",
            "status": "ok",
            "detail": "180.4 GFLOP/s fp32 at n=256",
            "seconds": 0.2,
        },
        {
            "name": "compile",
            "device": "cpu",
            "status": "ok",
            "detail": "inductor: first call 14.6 s, then 0.12 ms",
            "seconds": 30.0,
        },
        {
            "name": "allreduce",
            "device": "cpu",
            "status": "ok",
            "detail": "allreduce-gloo, 2 ranks: 3.22 ms per 1 MiB call, 0.33 GB/s bus",
            "seconds": 8.8,
        },
    ]
    report = {"tool_version": "0", "facts": {}, "probes": probes, "findings": []}
    console = Console(record=True, width=80, color_system=None)
    render(report, console)
    text = console.export_text()
    assert (
        "┃" not in text and "compile (cpu): ok · inductor: first call 14.6 s, then 0.12 ms · 30.0 s" in text
    )
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "┃" in _text(report)  # wide enough: the table as before

"""Probes on CPU, in this process: real matmuls, the timeout and failure paths, findings from results (the
compile child is in tests/integration/test_env_compile_probe.py, the 2-rank all_reduce in
tests/distributed/test_env_allreduce_probe.py)."""

from __future__ import annotations

import time

from torchscalpel.envcheck import probes
from torchscalpel.envcheck.probe_findings import findings_from_probes
from torchscalpel.envcheck.probes import ProbeResult


def test_matmul_probe_on_cpu_is_correct() -> None:
    r = probes.matmul_probe("cpu", budget=0.02)
    assert r.status == "ok", r.detail
    assert r.metrics["rel_err"] < 1e-5 and r.metrics["gflops"] > 0 and r.metrics["reps"] >= 2


def test_lowp_probe_reports_both_dtypes_against_fp32() -> None:
    r = probes.lowp_probe("cpu", budget=0.02)
    assert r.status == "ok"
    for label in ("bf16", "fp16"):
        m = r.metrics[label]
        assert m["supported"] is True
        assert m["speedup_vs_fp32"] > 0
        assert 0 < m["rel_err"] < 0.05  # half precision is close to fp32 but not equal
    assert r.metrics["bf16"]["rel_err"] > r.metrics["fp16"]["rel_err"]  # 8 vs 11 mantissa bits
    assert r.metrics["rounds"] >= 2


def test_in_process_probe_timeout_and_failure() -> None:
    slow = probes._with_timeout(
        "matmul", "cpu", 0.1, lambda: (time.sleep(1.0), ProbeResult(name="x", device="cpu", status="ok"))[1]
    )
    assert slow.status == "timeout" and "0.1 s" in slow.detail

    def boom() -> ProbeResult:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    failed = probes._with_timeout("matmul", "cuda:0", 5, boom)
    assert failed.status == "failed"
    assert failed.detail == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_run_probes_selects_and_orders() -> None:
    seen: list[str] = []
    r = probes.run_probes(["lowp", "matmul"], timeout=30, on_result=lambda x: seen.append(x.name))
    assert [x.name for x in r] == ["matmul", "lowp"] == seen  # PROBES order, not the user's


def _lowp(bf16: float, fp16: float) -> ProbeResult:
    metric = lambda s: {"supported": True, "speedup_vs_fp32": s, "gflops": 100 * s, "rel_err": 1e-3}  # noqa: E731
    return ProbeResult(
        name="lowp",
        device="cpu",
        status="ok",
        metrics={"n": 256, "fp32_gflops": 100.0, "bf16": metric(bf16), "fp16": metric(fp16)},
    )


def test_slow_half_precision_finding() -> None:
    found = findings_from_probes([_lowp(2.2, 0.005)])
    assert [f.rule for f in found] == ["slow-half-precision"]
    assert "fp16 matmul on cpu is 200x slower" in found[0].message
    assert "torch.bfloat16" in found[0].fix
    assert findings_from_probes([_lowp(2.2, 0.9)]) == []
    both = findings_from_probes([_lowp(0.1, 0.01)])[0]
    assert "bf16 and fp16" in both.message and "Keep fp32" in both.fix


def test_failed_and_timed_out_probes_become_findings() -> None:
    results = [
        ProbeResult(
            name="compile",
            device="cpu",
            status="failed",
            detail="InvalidCxxCompiler: No working C++ compiler found",
        ),
        {
            "name": "allreduce",
            "device": "cpu",
            "status": "timeout",
            "seconds": 60.0,
            "detail": "did not finish",
            "metrics": {},
        },
        ProbeResult(name="matmul", device="cpu", status="ok"),
        ProbeResult(name="allreduce", device="cpu", status="skipped"),
    ]
    found = findings_from_probes(results)
    assert [f.rule for f in found] == ["probe-compile-failed", "probe-allreduce-failed"]
    assert "timed out" in found[1].message and all(f.source == "env" for f in found)

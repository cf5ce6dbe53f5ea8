"""analyze_traces on the committed traces (tests/data/traces, from scripts/make_test_traces.py): exact figures.

Layout per 1000 µs step (scripts/make_test_traces.py's docstring): gemm [100, 400) and elementwise
[400, 450) on stream 7, memcpy [600, 620), the NCCL all-reduce [350, 350 + C) on stream 20 with
C = 200 µs on rank 0 and 100 µs on rank 1; 8 steps, ProfilerStep#10..17.
"""

from __future__ import annotations

import gzip
import json
import runpy

import pytest

from helpers import COMMITTED_TRACES, REPO
from torchscalpel.trace import analyze_traces


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    return analyze_traces(COMMITTED_TRACES / "gpu_2rank").to_dict()


def test_files_are_what_the_generator_writes() -> None:
    generator = runpy.run_path(str(REPO / "scripts" / "make_test_traces.py"))
    for rel, data in generator["files"]().items():
        assert json.loads(gzip.decompress((COMMITTED_TRACES / rel).read_bytes())) == data, rel


def test_step_breakdown_per_rank(two_ranks: dict) -> None:
    r0, r1 = two_ranks["ranks"]
    assert (r0["rank"], r1["rank"], r0["device"]) == (0, 1, "gpu")
    assert [s["name"] for s in r0["steps"]] == [f"ProfilerStep#{n}" for n in range(10, 18)]
    for s in r0["steps"]:
        # busy: [100, 550) ∪ [600, 620); communication counts only where no compute runs: [450, 550)
        assert (s["dur_us"], s["compute_us"], s["communication_us"], s["memcpy_us"]) == (1000, 350, 100, 20)
        assert (s["gpu_busy_us"], s["gpu_idle_us"], s["gpu_busy_pct"], s["launched"]) == (470, 530, 47.0, 4)
        # idle [0, 100) and [620, 1000): nothing launched yet; [550, 600): the memcpy launched at 405 is queued
        assert (s["host_wait_us"], s["kernel_wait_us"], s["other_wait_us"]) == (480, 0, 50)
        assert s["cpu_busy_us"] == 210
        assert s["cpu_categories"] == {"matmul": 100, "communication": 40, "elementwise": 40, "copy": 30}
    for s in r1["steps"]:  # the all-reduce [350, 450) hides entirely under the gemm
        assert (s["compute_us"], s["communication_us"], s["gpu_busy_us"], s["gpu_idle_us"]) == (
            350,
            0,
            370,
            630,
        )
        assert (s["host_wait_us"], s["other_wait_us"]) == (480, 150)


def test_whole_trace_gpu_summary(two_ranks: dict) -> None:
    g0, g1 = (r["gpu"] for r in two_ranks["ranks"])
    # HTA's window: kernels launched before the last step, 7 steps; first kernel at 100, last ends at 6620
    assert g0["window"] == "launched before the last step"
    assert (g0["kernel_time_us"], g0["idle_us"], g0["compute_us"], g0["non_compute_us"]) == (
        6520,
        3230,
        2450,
        840,
    )
    assert g0["kernel_types"] == {
        "COMPUTATION": 1750,
        "COMMUNICATION": 700,
        "COMPUTATION overlapping COMMUNICATION": 700,
        "MEMORY": 140,
    }
    assert g0["comm_comp_overlap_pct"] == 50.0  # 100 of the 200 µs all-reduce under compute
    assert (g1["kernel_time_us"], g1["idle_us"], g1["compute_us"], g1["non_compute_us"]) == (
        6520,
        3930,
        2450,
        140,
    )
    assert g1["kernel_types"] == {
        "COMPUTATION": 1750,
        "COMPUTATION overlapping COMMUNICATION": 700,
        "MEMORY": 140,
    }
    assert g1["comm_comp_overlap_pct"] == 100.0
    kernels = {k["name"]: k for k in g0["kernels"]}
    gemm = kernels["ampere_sgemm_128x128_tn"]
    assert (gemm["kernel_type"], gemm["count"], gemm["total_us"], gemm["mean_us"]) == (
        "COMPUTATION",
        7,
        2100,
        300,
    )
    nccl = next(k for name, k in kernels.items() if name.startswith("ncclKernel_AllReduce"))
    assert (nccl["kernel_type"], nccl["count"], nccl["total_us"], nccl["max_us"]) == (
        "COMMUNICATION",
        7,
        1400,
        200,
    )


def test_launches_ops_and_stragglers(two_ranks: dict) -> None:
    launch = two_ranks["ranks"][0]["launch"]
    # kernels launched at 20, 160, 310, started at 100, 400, 350: delays 80, 240, 40 (the memcpy is not a kernel)
    assert (launch["kernels"], launch["launches_matched"], launch["short_kernels"]) == (24, 24, 0)
    assert (launch["launch_delay_mean_us"], launch["launch_delay_p50_us"], launch["launch_delay_max_us"]) == (
        120,
        80,
        240,
    )
    ops = {o["name"]: o for o in two_ranks["top_ops"]}
    assert ops["aten::mm"] == {
        "name": "aten::mm",
        "category": "matmul",
        "count": 16,
        "self_us": 1600,
        "total_us": 1600,
    }
    assert two_ranks["categories"] == {"matmul": 1600, "elementwise": 640, "communication": 640, "copy": 480}
    s = two_ranks["stragglers"]
    assert [row["step"] for row in s["steps"]] == [f"ProfilerStep#{n}" for n in range(10, 18)]
    assert s["mean_step_us"] == {0: 1000, 1: 1000} and s["mean_communication_us"] == {0: 100, 1: 0}
    assert s["likely_straggler"] == 1  # rank 0 waits in its all-reduce for rank 1


def test_cpu_only() -> None:
    r = analyze_traces(COMMITTED_TRACES / "cpu_only").to_dict()
    rank = r["ranks"][0]
    assert (rank["rank"], rank["device"], rank["gpu"]) == (3, "cpu", None)
    assert [s["name"] for s in rank["steps"]] == ["ProfilerStep#5", "ProfilerStep#6", "ProfilerStep#7"]
    step = rank["steps"][0]
    assert "compute_us" not in step and (step["dur_us"], step["cpu_busy_us"]) == (500, 250)
    assert step["cpu_categories"] == {"matmul": 180, "elementwise": 50, "memory": 20}
    ops = {o["name"]: (o["count"], o["self_us"], o["total_us"]) for o in r["top_ops"]}
    assert ops == {"aten::addmm": (3, 540, 600), "aten::relu": (3, 150, 150), "aten::empty": (3, 60, 60)}


def test_rocm_fractional_timestamps() -> None:
    """The rank-0 layout on an MI250X with every GPU event 0.25 µs late: same figures, except that HTA's
    rounding of fractional timestamps changes them."""
    exact = analyze_traces(COMMITTED_TRACES / "rocm_mi250").to_dict()["ranks"][0]
    assert exact["device"] == "rocm" and exact["steps"][0]["launched"] == 4
    assert (exact["steps"][0]["compute_us"], exact["steps"][0]["communication_us"]) == (350, 100)
    g = exact["gpu"]
    assert (g["kernel_time_us"], g["idle_us"], g["compute_us"], g["non_compute_us"]) == (
        6520,
        3230,
        2450,
        840,
    )
    rounded = analyze_traces(COMMITTED_TRACES / "rocm_mi250", hta_rounding=True).to_dict()["ranks"][0]["gpu"]
    assert rounded["compute_us"] < g["compute_us"]
    assert rounded["compute_us"] + rounded["non_compute_us"] + rounded["idle_us"] == pytest.approx(
        rounded["kernel_time_us"]
    )

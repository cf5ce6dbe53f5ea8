"""Our temporal and kernel breakdowns agree with HolisticTraceAnalysis's figures within 1%.

HTA's figures were recorded once into tests/data/hta_*.json by
``benchmarks/trace_analysis.py record-hta`` (HTA is never imported at test time).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchscalpel.trace import analyze_traces

DATA = Path(__file__).resolve().parents[1] / "data"
CASES = {
    "gpu_2rank": ["gpu_2rank"],
    "alexnet_gpu": ["alexnet_gpu"],
    "rocm_mi250": ["rocm_mi250"],
    "compare_base": ["compare/base.json.gz"],
    "compare_test": ["compare/test.json.gz"],
}


def _close(ours: float, theirs: float) -> bool:
    return abs(ours - theirs) <= 0.01 * max(abs(theirs), 1.0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_temporal_and_kernel_breakdown_match_hta(case: str, traces_dir: Path) -> None:
    ref = json.loads((DATA / f"hta_{case}.json").read_text())
    result = analyze_traces([traces_dir / p for p in CASES[case]], hta_rounding=True).to_dict()
    by_rank = {r["rank"]: r["gpu"] for r in result["ranks"]}
    assert set(by_rank) == {row["rank"] for row in ref["temporal"]}
    for row in ref["temporal"]:
        g = by_rank[row["rank"]]
        for key in ("kernel_time_us", "idle_us", "compute_us", "non_compute_us"):
            assert _close(g[key], row[key]), (case, row["rank"], key, g[key], row[key])
    types: dict[str, float] = {}
    for g in by_rank.values():
        for k, v in g["kernel_types"].items():
            types[k] = types.get(k, 0.0) + v
    for k, v in ref["kernel_types"].items():
        assert _close(types.get(k, 0.0), v), (case, k, types.get(k), v)
    ours = {(rank, k["name"]): k for rank, g in by_rank.items() for k in g["kernels"]}
    for k in ref["kernels"]:
        mine = ours[(k["rank"], k["name"])]
        assert mine["kernel_type"] == k["kernel_type"]
        for key, theirs in (
            ("total_us", "sum_us"),
            ("mean_us", "mean_us"),
            ("max_us", "max_us"),
            ("min_us", "min_us"),
        ):
            assert _close(mine[key], k[theirs]), (case, k["name"], key, mine[key], k[theirs])
    for rank, pct in ref["comm_comp_overlap_pct"].items():
        if pct == pct:  # HTA writes NaN when a rank has no communication kernels
            assert abs(by_rank[int(rank)]["comm_comp_overlap_pct"] - pct) <= 0.01 * pct


def test_rocm_without_hta_rounding_keeps_sub_microsecond_time(traces_dir: Path) -> None:
    """The documented difference: HTA rounds fractional timestamps and loses time on short kernels."""
    ref = json.loads((DATA / "hta_rocm_mi250.json").read_text())["temporal"][0]
    g = analyze_traces(traces_dir / "rocm_mi250").to_dict()["ranks"][0]["gpu"]
    assert g["compute_us"] > ref["compute_us"] * 1.05
    assert g["compute_us"] + g["non_compute_us"] + g["idle_us"] == pytest.approx(g["kernel_time_us"])

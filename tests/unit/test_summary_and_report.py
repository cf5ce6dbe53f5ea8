"""Summary statistics and the HTML report built from a synthetic record."""

from __future__ import annotations

import pytest

from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.report.html import write_report
from torchscalpel.runtime.peaks import mfu, peak_tflops
from torchscalpel.runtime.summary import summarize


def _step(i: int, total: float, warmup: bool = False, profiled: bool = False) -> StepRecord:
    return StepRecord(
        index=i, warmup=warmup, profiled=profiled, total_ms=total, data_ms=1, forward_ms=2, backward_ms=3,
        optimizer_ms=1, other_ms=total - 7, loss=1.0 / (i + 1), samples=32, rss=100 + i,
    )


def test_summary_leaves_out_warmup_and_profiled_steps():
    r = RunRecord()
    r.steps = [_step(0, 100, warmup=True), _step(1, 10), _step(2, 50, profiled=True), _step(3, 12), _step(4, 14)]
    s = summarize(r)
    assert s["steps_measured"] == 4 and s["steps_summarized"] == 3
    assert s["median_step_ms"] == 12
    assert sum(s["phase_mean_ms"].values()) == pytest.approx(s["mean_step_ms"])
    assert s["breakdown_max_error"] == pytest.approx(0.0)
    assert s["samples_per_s"] == pytest.approx(32 / 0.012)
    assert s["first_loss"] == 1.0 and s["rss_peak"] == 104


def test_flops_become_achieved_rate_and_mfu_on_a_known_gpu():
    r = RunRecord(environment={"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]}, config={"device": "cuda:0"})
    r.steps = [_step(0, 10), _step(1, 10)]
    r.profiler = {"flops_total": 2e12, "steps": [0, 1]}
    s = summarize(r)
    assert s["achieved_flops_per_s"] == pytest.approx(1e14)
    assert s["mfu"]["mfu"] == pytest.approx(1e14 / 989e12)
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0  # longest key wins over "H100"
    assert peak_tflops("Some Unknown GPU") is None
    assert mfu(1e12, {"gpus": []}, "cpu") is None


def test_report_is_self_contained_and_has_the_charts(tmp_path):
    r = RunRecord(name="demo", status="stopped")
    r.steps = [_step(i, 10 + i, warmup=i == 0) for i in range(6)]
    r.profiler = {"steps": [2], "top_ops": [{"name": "aten::addmm", "category": "matmul", "count": 3, "self_us": 1500.0, "total_us": 1600.0}]}
    r.summary = summarize(r)
    html = write_report(r, tmp_path / "report.html").read_text()
    for chart in ("step-breakdown", "loss", "memory", "top-ops"):
        assert f'data-chart="{chart}"' in html
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "aten::addmm" in html

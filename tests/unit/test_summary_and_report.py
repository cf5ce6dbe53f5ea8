"""Summary statistics and the HTML report built from a synthetic record."""

from __future__ import annotations

import pytest

from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.report.html import write_report
from torchscalpel.runtime.peaks import mfu, peak_tflops
from torchscalpel.runtime.summary import summarize


def _step(i: int, total: float, warmup: bool = False, profiled: bool = False) -> StepRecord:
    return StepRecord(
        index=i,
        warmup=warmup,
        profiled=profiled,
        total_ms=total,
        data_ms=1,
        forward_ms=2,
        backward_ms=3,
        optimizer_ms=1,
        other_ms=total - 7,
        loss=1.0 / (i + 1),
        samples=32,
        rss=100 + i,
    )


def test_summary_leaves_out_warmup_and_profiled_steps():
    r = RunRecord()
    r.steps = [
        _step(0, 100, warmup=True),
        _step(1, 10),
        _step(2, 50, profiled=True),
        _step(3, 12),
        _step(4, 14),
    ]
    s = summarize(r)
    assert s["steps_measured"] == 4 and s["steps_summarized"] == 3
    assert s["median_step_ms"] == 12
    assert sum(s["phase_mean_ms"].values()) == pytest.approx(s["mean_step_ms"])
    assert s["breakdown_max_error"] == pytest.approx(0.0)
    assert s["samples_per_s"] == pytest.approx(32 / 0.012)
    assert s["first_loss"] == 1.0 and s["rss_peak"] == 104


def test_flops_become_achieved_rate_and_mfu_on_a_known_gpu():
    r = RunRecord(
        environment={"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]}, config={"device": "cuda:0"}
    )
    r.steps = [_step(0, 10), _step(1, 10)]
    r.profiler = {"steps": [0], "flops_step": 1, "flops_total": 1e12, "flops_recompute": 0}
    s = summarize(r)
    assert s["flops_per_step"] == 1e12  # one counted step, not a total over the profiled steps
    assert s["achieved_flops_per_s"] == pytest.approx(1e14)
    assert s["mfu"]["mfu"] == pytest.approx(1e14 / 989e12)
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0  # longest key wins over "H100"
    assert peak_tflops("Some Unknown GPU") is None
    assert mfu(1e12, {"gpus": []}, "cpu") is None


def test_report_is_self_contained_and_has_the_charts(tmp_path):
    r = RunRecord(name="demo", status="stopped")
    r.steps = [_step(i, 10 + i, warmup=i == 0) for i in range(6)]
    r.profiler = {
        "steps": [2],
        "top_ops": [
            {"name": "aten::addmm", "category": "matmul", "count": 3, "self_us": 1500.0, "total_us": 1600.0}
        ],
    }
    r.summary = summarize(r)
    html = write_report(r, tmp_path / "report.html").read_text()
    for chart in ("step-breakdown", "loss", "memory", "top-ops"):
        assert f'data-chart="{chart}"' in html
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "aten::addmm" in html


def test_every_share_shown_is_the_share_of_the_median_shown_beside_it(tmp_path):
    """One outlier step (a 990 ms data stall) once gave a 0.04 ms median phase a mean share of 95%."""
    import io

    from rich.console import Console

    import torchscalpel.report.profile_terminal as profile_terminal

    r = RunRecord(name="outlier", status="stopped")
    r.steps = [
        StepRecord(
            index=i,
            total_ms=10.0,
            data_ms=0.04,
            forward_ms=4.0,
            backward_ms=4.0,
            optimizer_ms=1.0,
            other_ms=0.96,
        )
        for i in range(5)
    ]
    r.steps.append(
        StepRecord(
            index=5,
            total_ms=1000.0,
            data_ms=990.04,
            forward_ms=4.0,
            backward_ms=4.0,
            optimizer_ms=1.0,
            other_ms=0.96,
        )
    )
    r.summary = summarize(r)
    buf = io.StringIO()
    profile_terminal.render(r, tmp_path, out=Console(file=buf, width=200, color_system=None))
    rows = {line.split()[1]: line.split() for line in buf.getvalue().splitlines() if line.startswith("│")}
    assert rows["data"][3] == "0.04" and rows["data"][5] == "0.4%", rows["data"]
    assert rows["forward"][5] == "40.0%", rows["forward"]
    assert r.summary["median_step_ms"] == 10.0
    assert r.summary["phase_median_ms"]["data"] == pytest.approx(0.04)
    assert r.summary["phase_median_share"]["data"] == pytest.approx(0.004)
    html = write_report(r, tmp_path / "report.html").read_text()
    assert '<td class="">data</td><td class="num">0.040</td><td class="num">0.4%</td>' in html


def test_phase_shares_that_do_not_add_up_are_explained_on_the_terminal(tmp_path):
    """Per-phase medians over the same steps need not sum to the median step (seen: 115.7%, no word)."""
    import io

    from rich.console import Console

    import torchscalpel.report.profile_terminal as profile_terminal

    def shown(forward: list[float], backward: list[float]) -> str:
        r = RunRecord(name="phases", status="stopped")
        r.steps = [
            StepRecord(
                index=i,
                total_ms=f + b,
                data_ms=0.0,
                forward_ms=f,
                backward_ms=b,
                optimizer_ms=0.0,
                other_ms=0.0,
            )
            for i, (f, b) in enumerate(zip(forward, backward, strict=True))
        ]
        r.summary = summarize(r)
        buf = io.StringIO()
        profile_terminal.render(r, tmp_path, out=Console(file=buf, width=200, color_system=None))
        return buf.getvalue()

    # step totals 10, 6, 10 (median 10); forward's median 5, backward's 1: 60% of the median step
    assert "phase shares add up to 60.0%: each phase's median is taken on its own" in shown(
        [9, 5, 1], [1, 1, 9]
    )
    assert "phase shares add up to" not in shown([6, 6, 6], [4, 4, 4])  # 100%: nothing to explain


def test_profile_summary_at_80_columns_keeps_names_and_figures_whole(tmp_path):
    """An 80-column terminal: the top-ops table cut long op names to one "…" label; figures stay whole."""
    import io

    from rich.console import Console

    import torchscalpel.report.profile_terminal as profile_terminal

    r = RunRecord(name="t", status="complete", target={"script": "train.py"})
    r.steps = [
        StepRecord(
            index=i, total_ms=1234.5, forward_ms=400.0, backward_ms=700.0, optimizer_ms=100.0, other_ms=34.5
        )
        for i in range(6)
    ]
    r.summary = summarize(r)
    r.profiler = {"steps": [3, 4], "trace": "trace.json.gz"}
    long_a = "aten::_scaled_dot_product_flash_attention_for_cpu_backward_first_variant"
    long_b = "aten::_scaled_dot_product_flash_attention_for_cpu_backward_second_variant"
    r.sections["trace"] = {
        "top_ops": [
            {"name": long_a, "category": "attention", "count": 123456, "self_us": 123456789.0},
            {"name": long_b, "category": "attention", "count": 24, "self_us": 98765.4},
        ]
    }
    buf = io.StringIO()
    profile_terminal.render(r, tmp_path, out=Console(file=buf, width=80))
    text = buf.getvalue()
    # a line longer than the screen only where it holds the run folder's path (one word: it cannot be wrapped;
    # a fresh machine's temporary folder alone can be 80 characters)
    assert all(len(line) <= 80 or str(tmp_path) in line for line in text.splitlines())
    assert "…" not in text  # nothing cut
    for whole in ("123456.79", "98.77", "1234.50", "56.7%", "123456"):
        assert whole in text, whole
    # the table does not fit 80 columns: each op is a row of "header value" pairs, its name whole on one line
    assert long_a in text and long_b in text
    assert not any(line.count("│") >= 5 for line in text.splitlines())
    assert "calls 123456" in text and "self ms 123456.79" in text


def test_profile_summary_says_the_machine_was_busy(tmp_path):
    """Load 13 on 2 cores: the step times are noisy, and the summary says so (doctor's findings do not:
    they are about the script)."""
    import io

    from rich.console import Console

    import torchscalpel.report.profile_terminal as profile_terminal
    from torchscalpel.doctor.api import _env_findings

    r = RunRecord(name="t", status="complete", target={"script": "train.py"})
    r.steps = [StepRecord(index=i, total_ms=10.0, forward_ms=10.0) for i in range(4)]
    r.summary = summarize(r)
    r.environment = {"cpu": {"usable_cores": 2, "load_avg_1m": 13.0}}
    buf = io.StringIO()
    profile_terminal.render(r, tmp_path, out=Console(file=buf, width=200))
    assert "note: This machine is busy (load 13.0 on 2 cores)" in buf.getvalue()
    assert [f.rule for f in _env_findings(r)] == []
    r.environment["cpu"]["load_avg_1m"] = 1.0
    buf = io.StringIO()
    profile_terminal.render(r, tmp_path, out=Console(file=buf, width=200))
    assert "busy" not in buf.getvalue()


def test_no_step_time_when_every_measured_step_was_instrumented(tmp_path):
    import torchscalpel.report.profile_terminal as profile_terminal
    from torchscalpel.console import make_console
    from torchscalpel.record_check import check_invariants

    r = RunRecord(target={"script": "train.py"}, config={"warmup": 1})
    r.steps = [_step(0, 100, warmup=True), _step(1, 900, profiled=True), _step(2, 800, profiled=True)]
    r.steps[1].flops_counted = True
    s = summarize(r)
    assert s["steps_measured"] == 2 and s["steps_summarized"] == 0
    assert "median_step_ms" not in s and "mean_step_ms" not in s
    assert s["step_time_not_measured"].startswith("every measured step was instrumented")
    assert s["first_loss"] == 1.0 and s["rss_peak"] == 102  # what every step holds is still summarized
    r.summary = s
    assert not [v for v in check_invariants(r) if "median_step_ms" in v or "steps_summarized" in v]
    c = make_console(width=100, record=True)
    profile_terminal.render(r, tmp_path, out=c)
    assert "step time: not measured: every measured step was instrumented" in c.export_text()
    r.summary = {**s, "median_step_ms": 900.0}  # the old fallback: a step time read from slowed steps
    assert any("every measured step was instrumented" in v for v in check_invariants(r))


def test_ops_with_no_flop_formula_are_named_beside_the_flops(tmp_path):
    from torchscalpel.report.profile_terminal import flops_text
    from torchscalpel.runtime.summary import uncounted_ops

    r = RunRecord(target={"script": "train.py"})
    r.steps = [_step(0, 10), _step(1, 10)]
    r.profiler = {
        "steps": [1],
        "flops_step": 0,
        "flops_total": 4e8,
        "flops_eval": 2e8,
        "flops_by_op": [{"name": "aten::addmm", "count": 2, "flops": 4e8, "recompute": 0}],
        "flops_unformulated": ["aten::_sparse_addmm", "aten::my_rare_kernel"],
    }
    r.sections["trace"] = {
        "op_table": {
            "aten::addmm": [2, 500.0, 520.0],
            "aten::_sparse_addmm": [2, 440.0, 450.0],
            "aten::my_rare_kernel": [1, 20.0, 20.0],  # 2%: below the line's threshold
            "aten::add_": [9, 40.0, 40.0],
        }
    }
    r.summary = summarize(r)
    rows = uncounted_ops(r)
    assert [row["name"] for row in rows] == ["aten::_sparse_addmm"]
    assert rows[0]["share"] == pytest.approx(450 / 1000)
    r.summary["flops_uncounted"] = rows
    text = flops_text(r)
    assert "achieved; not counted (no FLOP formula): aten::_sparse_addmm (45.0% of op time)" in text
    assert "evaluation forwards between steps (200.0 MFLOP) left out of the FLOPs" in text
    assert r.summary_view().flops_per_step == 4e8 and r.summary_view().eval_flops == 2e8


def test_flop_rate_is_over_the_step_time_less_its_evaluation_forwards():
    from torchscalpel.record_check import check_invariants
    from torchscalpel.report.profile_terminal import flops_text

    r = RunRecord(target={"script": "train.py"})
    r.steps = [_step(0, 10), _step(1, 10), _step(2, 10)]
    for st in r.steps[1:]:
        st.eval_ms = 4.0  # a test() forward after each step, inside its "other"
    r.profiler = {
        "steps": [],
        "flops_step": 0,
        "flops_total": 6e6,
        "flops_eval": 2e6,
        "flops_by_op": [{"name": "aten::mm", "count": 3, "flops": 6e6, "recompute": 0}],
    }
    s = summarize(r)
    assert s["median_step_ms"] == 10 and s["training_step_ms"] == 6
    assert s["achieved_flops_per_s"] == pytest.approx(6e6 / 0.006)  # not 6e6 / 0.010
    r.summary = s
    assert not check_invariants(r)
    assert "(2.0 MFLOP, 4.00 ms of the median step) left out of the FLOPs and of the time" in flops_text(r)
    r.summary = {**s, "achieved_flops_per_s": 6e6 / 0.010}
    assert any("training_step_ms" in v for v in check_invariants(r))
    assert (
        RunRecord.from_dict(r.to_dict()).steps[1].eval_ms == 4.0 and "eval_ms" not in r.to_dict()["steps"][0]
    )

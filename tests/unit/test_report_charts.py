"""The report's charts and section order: axis titles with units, nice ticks, fitted ranges, legends only
for several series, capacity lines, short kernel names, verdicts before evidence before the environment."""

from __future__ import annotations

import re

from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.report import charts
from torchscalpel.report.html import record_page, verdict_first
from torchscalpel.report.names import demangle, short_kernel_name
from torchscalpel.report.page import Section


def _ticks(svg: str, axis: str = "") -> list[str]:
    return re.findall(rf'<text class="tick {axis}[^"]*"[^>]*>([^<]*)</text>', svg)


def _titles(svg: str) -> dict[str, str]:
    return dict(re.findall(r'<text class="axis-title (x|y)-title"[^>]*>([^<]*)</text>', svg))


def test_nice_ticks_land_on_round_numbers_and_cover_the_range() -> None:
    assert charts.nice_ticks(0, 872) == [0, 200, 400, 600, 800, 1000]
    assert charts.nice_ticks(2.1, 2.45) == [2.1, 2.2, 2.3, 2.4, 2.5]
    ticks = charts.nice_ticks(0, 13, 8, integer=True)
    assert all(float(t).is_integer() for t in ticks) and ticks[0] == 0 and ticks[-1] >= 13
    assert [charts.tick_label(t, 0.25) for t in (0, 0.25, 0.5)] == ["0.00", "0.25", "0.50"]
    assert charts.tick_label(1000, 200) == "1,000"


def test_stacked_bars_have_titles_integer_steps_and_a_legend_for_several_series() -> None:
    svg = charts.stacked_bars(
        "s",
        ["0", "1", "2"],
        {"forward": [1, 2, 3], "backward": [2, 2, 2], "never": [0, 0, 0]},
        unit="ms",
        y_title="step time (ms)",
    )
    assert _titles(svg) == {"x": "step", "y": "step time (ms)"}
    assert 'class="legend"' in svg and "never" not in svg  # an all-zero series is left out of bars and legend
    assert "0.00" not in _ticks(svg) and "13.0" not in _ticks(svg)


def test_a_single_series_has_no_legend_and_a_loss_curve_is_not_pinned_to_zero() -> None:
    svg = charts.lines("loss", list(range(13)), {"loss": [4.6 - 0.1 * i for i in range(13)]}, y_title="loss")
    assert 'class="legend"' not in svg
    y_ticks = [float(t.replace(",", "")) for t in _ticks(svg, "y")]
    assert min(y_ticks) > 3.0  # fitted to 3.4 .. 4.6, not 0 .. 4.6
    assert "12" in _ticks(svg, "x") and all("." not in t for t in _ticks(svg, "x"))
    assert _titles(svg)["x"] == "step"


def test_a_flat_series_gets_a_short_chart_that_says_it_is_flat() -> None:
    flat = charts.lines(
        "rss", list(range(20)), {"RSS": [512.0 + 0.01 * (i % 2) for i in range(20)]}, unit="MiB"
    )
    height = int(re.search(r'viewBox="0 0 \d+ (\d+)"', flat).group(1))
    assert height <= 180 and "flat: 512 to 512 MiB" in flat
    assert _titles(flat)["y"] == "MiB"


def test_capacity_line_is_drawn_when_in_range_and_named_when_far_above() -> None:
    near = charts.stacked_bars(
        "p",
        ["ddp", "fsdp"],
        {"params": [300.0, 150.0], "activations": [500.0, 500.0]},
        unit="MiB",
        capacity=1000.0,
        capacity_label="device capacity 1000 MiB",
    )
    assert 'class="capacity"' in near and "device capacity 1000 MiB" in near
    far = charts.stacked_bars(
        "p",
        ["ddp", "fsdp"],
        {"params": [3.0, 2.0]},
        unit="MiB",
        capacity=81920.0,
        capacity_label="device 80 GiB",
    )
    assert 'class="capacity"' not in far and "device 80 GiB (above this scale)" in far
    assert "81,920" not in far  # the scale stays the bars' own


def test_horizontal_bars_have_a_value_axis_and_keep_full_names_on_hover() -> None:
    long = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
    svg = charts.horizontal_bars(
        "ops", [(long, 31.1), ("aten::mm", 147.0)], unit="ms", x_title="self time (ms)"
    )
    assert _titles(svg)["x"] == "self time (ms)" and f"<title>{long}</title>" in svg and "…" in svg
    assert _ticks(svg)[:2] == ["0", "50"]


def test_kernel_names_are_shortened_like_a_profiler_shows_them() -> None:
    full = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
    )
    assert short_kernel_name(full) == "at::native::vectorized_elementwise_kernel<…>"
    assert short_kernel_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"
    assert (
        short_kernel_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
        == "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    )
    assert demangle("_ZN2at6native18elementwise_kernelILi128EEEviT_") == "at::native::elementwise_kernel"
    assert short_kernel_name("aten::mm") == "aten::mm"


def test_verdicts_lead_and_the_environment_closes() -> None:
    order = [
        s.id
        for s in verdict_first(
            [
                Section(id=i, title=i, body="")
                for i in ("overview", "environment", "steps", "findings", "plan", "tune")
            ]
        )
    ]
    assert order == ["tune", "plan", "findings", "overview", "steps", "environment"]


def test_a_doctor_record_page_shows_findings_before_the_overview_and_the_environment() -> None:
    record = RunRecord(
        name="d",
        status="stopped",
        environment={"python": "3.11"},
        sections={"doctor": {}},
        steps=[
            StepRecord(index=i, total_ms=2.0, forward_ms=1.0, other_ms=1.0, loss=1.0 - 0.1 * i)
            for i in range(4)
        ],
        findings=[{"rule": "r", "severity": "warning", "message": "m", "evidence": [], "fix": ""}],
    )
    page = record_page(record)
    ids = re.findall(r'<section id="([^"]+)"', page)
    assert ids.index("findings") < ids.index("overview") < ids.index("environment") == len(ids) - 1


def test_a_left_out_series_does_not_shift_the_legend_colours() -> None:
    svg = charts.stacked_bars("s", ["1", "2"], {"a": [1.0, 1.0], "never": [0.0, 0.0], "c": [2.0, 2.0]})
    bar_fills = re.findall(r'<rect x="[^"]+" y="[^"]+" width="[^"]+" height="[^"]+" fill="([^"]+)">', svg)
    legend_fills = re.findall(r'<rect class="legend"[^>]* fill="([^"]+)"', svg)
    assert bar_fills == 2 * legend_fills and legend_fills == [charts.PALETTE[0], charts.PALETTE[2]]


def test_analyze_page_puts_its_verdict_then_the_diff_first(tmp_path) -> None:
    from torchscalpel.report.html import write_analysis_html

    data = {
        "ranks": [{"rank": 0, "device": "cpu", "events": 1, "steps": [], "complete": True, "path": "a.json"}],
        "top_ops": [
            {"name": "aten::mm", "category": "matmul", "count": 1, "self_us": 10.0, "total_us": 10.0}
        ],
    }
    diff = {"a": ["a.json"], "b": ["b.json"], "ops": {"rows": []}}
    out = tmp_path / "a.html"
    write_analysis_html(data, out, diff)
    ids = re.findall(r'<section id="([^"]+)"', out.read_text())
    assert ids[:2] == ["verdict", "trace-diff"] and "trace-ops" in ids


def test_kernel_table_shows_short_names_with_the_full_one_on_hover() -> None:
    import torchscalpel.report.trace_sections as trace_sections

    full = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int, float)"
    sections = trace_sections.build(
        {
            "ranks": [],
            "top_kernels": [
                {"name": full, "category": "elementwise", "count": 3, "total_us": 30.0, "mean_us": 10.0}
            ],
        }
    )
    body = next(s.body for s in sections if s.id == "trace-kernels")
    assert "<code>at::native::vectorized_elementwise_kernel&lt;…&gt;</code>" in body
    assert 'title="void at::native::vectorized_elementwise_kernel&lt;4, ' in body


def test_chart_labels_stay_distinct_apart_and_inside_the_chart() -> None:
    import itertools
    import re

    from torchscalpel.report import charts

    # two ops that share their first 43 characters were one "…" label
    a = "aten::_scaled_dot_product_flash_attention_for_cpu_backward_first"
    b = "aten::_scaled_dot_product_flash_attention_for_cpu_backward_second"
    svg = charts.horizontal_bars("ops", [(a, 2.0), (b, 1.0)])
    shown = re.findall(r'text-anchor="end">([^<]*)<title>', svg)
    assert len(shown) == 2 and shown[0] != shown[1], shown
    # 16 bars labelled "step N": every label drawn is at least its own width from the next
    labels = [f"step {i}" for i in range(10, 26)]
    svg = charts.stacked_bars("mem", labels, {"activations": [1.0] * 16}, unit="MiB")
    xs = [float(x) for x in re.findall(r'<text class="tick x-tick" x="([\d.]+)"', svg)]
    assert len(xs) >= 2 and min(b - a for a, b in itertools.pairwise(xs)) >= len("step 25") * charts.CHAR_W
    # the last x tick of a line chart is not centred past the chart's right edge
    svg = charts.lines("loss", list(range(0, 12001, 100)), {"loss": [1.0 + i for i in range(121)]})
    last = re.findall(
        r'<text class="tick x-tick" x="([\d.]+)" y="[\d.]+" text-anchor="(\w+)">([^<]*)</text>', svg
    )[-1]
    assert last[2] == "12,000" and (
        last[1] == "end" or float(last[0]) + len(last[2]) * charts.CHAR_W / 2 <= 760
    ), last


def test_a_chart_with_fewer_than_two_points_is_its_values_not_a_one_dot_chart() -> None:
    # the plan page was padded with one-dot charts: one bar, one point, one op say less than a line of text
    one_bar = charts.stacked_bars("p", ["ddp"], {"params": [3.0], "activations": [5.0]}, unit="MiB")
    one_point = charts.lines("loss", [0], {"loss": [2.5]}, y_title="loss")
    one_op = charts.horizontal_bars("ops", [("aten::mm", 4.0)])
    for html in (one_bar, one_point, one_op):
        assert "<svg" not in html and 'class="chart-values"' in html, html
    assert "params" in one_bar and "3.00 MiB" in one_bar and "5.00 MiB" in one_bar
    assert "2.50" in one_point and "aten::mm" in one_op and "4.00 ms" in one_op
    # two points are a chart
    assert "<svg" in charts.lines("loss", [0, 1], {"loss": [2.5, 2.0]})
    assert "<svg" in charts.stacked_bars("p", ["a", "b"], {"x": [1.0, 2.0]})


def test_a_long_legend_wraps_inside_the_chart() -> None:
    # tune's loss curves: five variants' labels in one row ran past the chart's right edge
    names = [
        "baseline",
        "amp=bf16 + amp_fp32_attention",
        "amp=bf16",
        "threads=2",
        "num_workers=1 + persistent_workers=True",
    ]
    svg = charts.lines("tune-losses", [0, 1, 2], {n: [2.0, 1.9, 1.8] for n in names}, unit="loss")
    legend = re.search(r'<g class="legend">(.*?)</g>', svg).group(1)
    entries = re.findall(r'<text x="([\d.]+)" y="([\d.]+)">([^<]*)</text>', legend)
    assert [e[2] for e in entries] == names
    assert all(float(x) + len(text) * 7 <= 760 for x, _, text in entries), entries
    assert len({y for _, y, _ in entries}) == 2  # two rows
    # the plot starts below the legend's second row
    top_grid = min(float(y) for y in re.findall(r'class="grid"[^>]*|y1="([\d.]+)"', svg) if y)
    assert top_grid >= max(float(y) for _, y, _ in entries) + 4


def test_a_positive_series_over_decades_gets_a_log_axis_and_a_narrow_one_stays_linear() -> None:
    from torchscalpel.report.charts.axes import log_tick_label, log_ticks, spans_decades

    descent = [2.0 - 0.03 * i for i in range(30)]
    spiked = charts.lines("loss", list(range(31)), {"loss": [*descent, 50.0]}, y_title="loss")
    assert 'data-y-scale="log"' in spiked and "loss (log scale)" in spiked
    assert 'data-y-min="1.13" data-y-max="50"' in spiked
    plain = charts.lines("loss", list(range(30)), {"loss": descent}, y_title="loss")
    assert 'data-y-scale="linear"' in plain and "log scale" not in plain
    # kept at zero, or with a value at or below zero: linear whatever the ratio
    assert 'data-y-scale="linear"' in charts.lines("m", [0, 1, 2], {"m": [1.0, 5.0, 80.0]}, zero=True)
    assert 'data-y-scale="linear"' in charts.lines("m", [0, 1, 2], {"m": [-1.0, 5.0, 80.0]})
    assert spans_decades(1.0, 10.0) and not spans_decades(1.0, 9.9) and not spans_decades(0.0, 5.0)
    assert log_ticks(1.13, 50.0) == [1.0, 2.0, 5.0, 10.0, 20.0, 50.0]
    assert log_ticks(0.003, 2000.0) == [0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0]
    assert [log_tick_label(v) for v in (0.02, 1.0, 50.0, 20000.0, 1e-5, 2e6)] == [
        "0.02",
        "1",
        "50",
        "2e4",
        "1e-5",
        "2e6",
    ]


def test_the_lr_sweeps_marks_stay_inside_the_chart_and_apart() -> None:
    import re

    xs = [10 ** (-5 + 5 * i / 39) for i in range(40)]
    losses = [2.0 - 0.03 * i for i in range(39)] + [50.0]
    svg = charts.lines(
        "lr-range-test",
        xs,
        {"loss": losses},
        x_title="learning rate (log scale)",
        y_title="loss",
        log_x=True,
        marks=[(xs[25], "suggested 0.0028"), (xs[-1], "diverged 1")],
    )
    assert 'data-y-scale="log"' in svg
    labels = re.findall(r'<text class="mark-label" x="([\d.]+)" y="([\d.]+)" text-anchor="(\w+)"', svg)
    assert len(labels) == 2 and labels[0][1] != labels[1][1]  # one row each
    x, _, anchor = labels[1]
    # the divergence at the sweep's end: its label ends at the mark, inside the chart (760 px wide)
    assert anchor == "end" and float(x) <= 760 - 14 and float(x) - len("diverged 1") * charts.CHAR_W >= 0


def test_the_memory_peak_is_drawn_above_the_step_end_bars_where_it_happened() -> None:
    import re

    svg = charts.stacked_bars(
        "memory-steps",
        ["step 0", "step 1", "step 2"],
        {"activations": [1.0, 1.0, 1.0], "parameters": [2.0, 2.0, 2.0]},
        unit="MiB",
        peak=(9.0, "peak 9.0 MiB (step 1, backward)", "step 1"),
    )
    assert '<text class="peak-label"' in svg and "peak 9.0 MiB (step 1, backward)" in svg
    ticks = [float(t) for t in re.findall(r'class="tick y-tick"[^>]*>([\d.]+)<', svg)]
    assert max(ticks) >= 9.0  # the scale reaches the peak, three times the step-end totals
    dot = re.search(r'<circle class="peak" cx="([\d.]+)"', svg)
    assert (
        dot and 66 + (760 - 66 - 12) / 3 < float(dot.group(1)) < 66 + 2 * (760 - 66 - 12) / 3
    )  # over step 1
    assert re.search(r'<text class="peak-label" x="[\d.]+" y="[\d.]+" text-anchor="end"', svg)
    # a peak in the last bar (memory growing to the limit): its label at the left, away from the tall bars
    late = charts.stacked_bars(
        "memory-steps",
        ["step 0", "step 1", "step 2"],
        {"a": [1.0, 2.0, 3.0]},
        unit="MiB",
        peak=(3.5, "peak 3.5 MiB (step 2, forward)", "step 2"),
    )
    assert re.search(r'<text class="peak-label" x="68.0" y="[\d.]+" text-anchor="start"', late)
    one = charts.stacked_bars(
        "memory-steps", ["step 0"], {"a": [1.0]}, unit="MiB", peak=(4.0, "peak 4 MiB", None)
    )
    assert "peak 4 MiB" in one  # one bar is a table: the peak is a row of it

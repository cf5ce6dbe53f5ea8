"""The one straggler rule (trace.ranks.straggler_verdict), read by scalpel launch and scalpel analyze."""

from __future__ import annotations

from torchscalpel.distributed.rankmerge import merge
from torchscalpel.record import RunRecord, StepRecord
from torchscalpel.report.launch_terminal import table as format_table
from torchscalpel.trace import ranks


def test_noise_level_difference_names_no_straggler() -> None:
    # the figures: 0.21 vs 0.25 ms per step, each rank jittering by a few hundredths
    v = ranks.straggler_verdict({0: [0.21, 0.20, 0.22, 0.21, 0.23], 1: [0.25, 0.24, 0.26, 0.25, 0.22]})
    assert v.measured and v.rank is None
    assert v.sentence.startswith("none: rank 1's 0.25 ms ±") and "against rank 0's 0.21 ms ±" in v.sentence
    # a 5% gap whose steps scatter by more than that is noise too (a real 2-rank CPU launch's figures)
    v = ranks.straggler_verdict({0: [46.91, 51.84, 46.50], 1: [49.36, 53.47, 47.82]})
    assert v.rank is None and v.gap_ms is not None and v.needed_ms is not None and v.gap_ms < v.needed_ms
    # one outlier step on the fast rank does not move its median or its spread much
    v = ranks.straggler_verdict({0: [50.0, 50.5, 49.8, 400.0, 50.2], 1: [51.0, 50.7, 51.2, 50.9, 51.1]})
    assert v.rank is None


def test_a_rank_twice_as_slow_with_tight_spreads_is_named_with_both_figures() -> None:
    v = ranks.straggler_verdict(
        {0: [50.0, 50.5, 49.8, 50.2], 1: [100.0, 101.0, 100.4, 99.7], 2: [50.3, 50.1, 50.6, 49.9]}
    )
    assert (v.rank, v.candidate, v.compared_with) == (1, 1, 2)
    assert v.sentence.startswith("rank 1: 100.20 ms ±") and "against rank 2's 50.20 ms ±" in v.sentence
    assert "50.00 ms (100%) slower" in v.sentence and "the other ranks wait for it" in v.sentence


def test_gap_below_the_absolute_floor_is_not_a_straggler_even_without_noise() -> None:
    v = ranks.straggler_verdict({0: [0.2] * 4, 1: [0.2 + ranks.MIN_GAP_MS * 0.8] * 4})
    assert v.rank is None and v.needed_ms == ranks.MIN_GAP_MS


def test_gap_below_the_share_floor_is_not_a_straggler_even_without_noise() -> None:
    assert ranks.straggler_verdict({0: [100.0] * 4, 1: [108.0] * 4}).rank is None  # 8% < 10%
    assert ranks.straggler_verdict({0: [100.0] * 4, 1: [112.0] * 4}).rank == 1


def test_too_few_steps_is_not_measured() -> None:
    v = ranks.straggler_verdict({0: [10.0, 10.0], 1: [30.0, 30.0, 30.0]})
    assert not v.measured and v.rank is None
    assert v.sentence == "not measured: rank 0 has 2 steps; a spread needs 3 per rank"


def _record(totals: list[float], window: list[tuple[float, float]] | None = None) -> RunRecord:
    """Measured steps with ``totals`` ms; ``window``: (step µs, collective µs) per profiled step."""
    steps = [StepRecord(index=0, warmup=True, total_ms=999.0)]
    steps += [StepRecord(index=i + 1, total_ms=t) for i, t in enumerate(totals)]
    sections = {}
    if window:
        sections["trace"] = {
            "ranks": [
                {
                    "rank": 0,
                    "steps": [
                        {
                            "name": f"ProfilerStep#{i}",
                            "start_us": i * 1e5,
                            "dur_us": d,
                            "cpu_categories": {"communication": c},
                        }
                        for i, (d, c) in enumerate(window)
                    ],
                }
            ],
            "categories": {"communication": sum(c for _, c in window)},
        }
    return RunRecord(status="stopped", steps=steps, profiler={"steps": [1, 2, 3]}, sections=sections)


def test_launch_merge_uses_time_outside_collectives() -> None:
    # synchronous ranks: equal wall steps; rank 0 spends half of each step waiting in its all-reduce
    window0 = [(100e3, 50e3), (101e3, 50.5e3), (100.5e3, 50.2e3)]
    window1 = [(100e3, 0.2e3), (101e3, 0.21e3), (100.5e3, 0.25e3)]
    merged = merge({0: _record([100.0, 101.0, 100.5], window0), 1: _record([100.0, 101.0, 100.5], window1)})
    assert merged["straggler"]["rank"] == 1
    assert merged["straggler_verdict"]["what"] == "per profiled step outside collectives"
    # the collective ms column counts what the rule subtracts: the mean per profiled step
    assert [round(row["collective_ms"], 3) for row in merged["ranks"]] == [50.233, 0.22]
    table = format_table(merged)
    assert "straggler: rank 1: 100.25 ms ±" in table and "against rank 0's 50.30 ms ±" in table


def test_launch_merge_names_no_straggler_on_noise() -> None:
    # the case the issue saw: collective time 0.21 vs 0.25 ms per step, the same work otherwise
    window0 = [(47.8e3, 0.88e3), (58.8e3, 7.0e3), (47.0e3, 0.47e3)]
    window1 = [(49.6e3, 0.19e3), (53.7e3, 0.22e3), (48.0e3, 0.21e3)]
    merged = merge({0: _record([38.4, 75.4, 130.1], window0), 1: _record([37.0, 929.8, 129.7], window1)})
    assert merged["straggler"] is None
    assert "straggler: none: rank 1's 49.41 ms ±2.40" in format_table(merged)


def test_launch_merge_without_traces_uses_step_times() -> None:
    merged = merge({0: _record([10.0, 10.2, 10.1]), 1: _record([25.0, 25.3, 24.9])})
    assert merged["straggler"]["rank"] == 1 and merged["straggler_verdict"]["what"] == "per step"


def _gloo_trace(path, rank: int, waits_us: list[float]) -> None:
    """A CPU rank trace: 10 ms steps, each ending in a gloo all-reduce (on gloo's worker thread) of ``waits_us``."""
    import json

    events = []
    for i, wait in enumerate(waits_us):
        t0 = 1_000_000.0 + i * 10_000.0
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{i + 3}",
                "ts": t0,
                "dur": 10_000.0,
                "pid": 1,
                "tid": 1,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "c10d::allreduce_",
                "ts": t0 + 100.0,
                "dur": 20.0,
                "pid": 1,
                "tid": 1,
            }
        )  # the enqueue: a few µs whatever the wait
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "gloo:all_reduce",
                "ts": t0 + 9_900.0 - wait,
                "dur": wait,
                "pid": 1,
                "tid": 2,
            }
        )
    path.write_text(json.dumps({"distributedInfo": {"rank": rank}, "traceEvents": events}))


def test_gloo_waits_on_the_worker_thread_count_as_collective_time(tmp_path) -> None:
    """On CPU the wait for a slow rank is inside gloo's worker-thread annotation, not in c10d::allreduce_:
    a 2-rank DDP run where rank 1 slept 40 ms per step was 'none' until this was counted."""
    from torchscalpel.trace.analyze import analyze_traces

    _gloo_trace(tmp_path / "rank-0.json", 0, [6000.0, 6100.0, 5900.0])  # rank 0 waits ~6 ms per step
    _gloo_trace(tmp_path / "rank-1.json", 1, [200.0, 250.0, 210.0])
    result = analyze_traces(tmp_path).to_dict()
    assert [s["collective_wall_us"] for s in result["ranks"][0]["steps"]] == [6000.0, 6100.0, 5900.0]
    s = result["stragglers"]
    assert s["likely_straggler"] == 1
    assert s["reason"].startswith(
        "rank 1: 9.79 ms ±0.01 per step outside collectives against rank 0's 4.00 ms ±"
    )

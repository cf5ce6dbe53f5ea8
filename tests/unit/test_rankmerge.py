"""Per-rank merge of launch --profile/--doctor records, and the per-rank entry point's argv."""

from __future__ import annotations

from torchscalpel.distributed.rank_entry import rank_argv
from torchscalpel.distributed.rankmerge import load_rank_records, merge
from torchscalpel.record import RunRecord, StepRecord, save_record
from torchscalpel.report.launch_terminal import table as format_table


def _record(step_ms: list[float], comm_us: float, findings=()) -> RunRecord:
    steps = [StepRecord(index=0, warmup=True, total_ms=999.0)]
    steps += [StepRecord(index=i + 1, total_ms=t, data_ms=1.0) for i, t in enumerate(step_ms)]
    return RunRecord(
        status="stopped",
        steps=steps,
        profiler={"steps": [1, 2], "categories": {"communication": comm_us}},
        findings=list(findings),
    )


def test_merge_rows_findings_and_no_straggler_on_equal_steps(tmp_path):
    finding = {"rule": "no-grad-sync", "severity": "warning", "message": "x"}
    save_record(
        _record([10.0, 12.0, 11.0], comm_us=8000.0, findings=[finding]), tmp_path / "rank-0" / "run.json"
    )
    save_record(
        _record([11.0, 11.0, 11.0], comm_us=1000.0, findings=[finding]), tmp_path / "rank-1" / "run.json"
    )
    (tmp_path / "logs").mkdir()
    merged = merge(load_rank_records(tmp_path))
    rows = {r["rank"]: r for r in merged["ranks"]}
    assert rows[0]["step_ms"] == 11.0 and rows[0]["collective_ms"] == 4.0 and rows[0]["compute_ms"] == 7.0
    assert rows[1]["collective_ms"] == 0.5 and rows[1]["steps"] == 3
    # less collective time alone does not make rank 1 a straggler: its steps are as long as rank 0's
    # (trace.ranks.straggler_verdict; tests/unit/test_straggler_rule.py covers the rule)
    assert merged["straggler"] is None
    assert merged["findings"][0]["ranks"] == [0, 1]
    table = format_table(merged)
    assert (
        "straggler: none: rank 0's 11.00 ms ±1.48 per step against rank 1's 11.00 ms ±0.00: 0.00 ms (0%) slower"
        in table
    )
    assert "(ranks 0,1)" in table


def test_no_straggler_verdict_from_one_step(tmp_path):
    save_record(_record([10.0], comm_us=2000.0), tmp_path / "rank-0" / "run.json")
    save_record(_record([10.0], comm_us=1950.0), tmp_path / "rank-1" / "run.json")
    merged = merge(load_rank_records(tmp_path))
    assert merged["straggler"] is None
    assert (
        "straggler: not measured: rank 0 has 1, rank 1 has 1 step; a spread needs 3 per rank"
        in format_table(merged)
    )


def test_rank_argv_uses_global_rank_and_one_report():
    argv = ["profile", "/runs/x", "--steps", "5", "--", "train.py", "--lr", "1"]
    assert rank_argv(argv, 0) == [
        "profile",
        "--out",
        "/runs/x/rank-0",
        "--steps",
        "5",
        "--",
        "train.py",
        "--lr",
        "1",
    ]
    assert rank_argv(argv, 3)[:4] == ["profile", "--out", "/runs/x/rank-3", "--no-report"]

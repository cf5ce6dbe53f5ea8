"""Merging the ranks' doctor findings; rank-conditional-step from differing step counts."""

from __future__ import annotations

from torchscalpel.doctor.finding import Finding, Location, Severity
from torchscalpel.doctor.ranks import merge_rank_findings
from torchscalpel.record import RunRecord, StepRecord


def record(steps: int, *findings: Finding, micro: int = 1) -> RunRecord:
    return RunRecord(status="complete", step_kind="optimizer",
                     steps=[StepRecord(index=i, micro_batches=micro) for i in range(steps)],
                     findings=[f.to_dict() for f in findings])


SAME = Finding(rule="ddp-no-distributed-sampler", severity=Severity.ERROR, message="same data",
               location=Location(file="t.py", line=3))
ONLY1 = Finding(rule="eval-in-train-mode", severity=Severity.WARNING, message="train mode")


def test_same_finding_on_every_rank_is_merged_and_rank_specific_ones_keep_their_rank() -> None:
    merged = merge_rank_findings({0: record(5, SAME), 1: record(5, SAME, ONLY1)})
    assert [f.rule for f in merged] == ["ddp-no-distributed-sampler", "eval-in-train-mode"]
    assert merged[0].rank is None and "seen on ranks 0, 1" in merged[0].evidence
    assert merged[1].rank == 1


def test_ranks_with_different_step_counts_raise_rank_conditional_step() -> None:
    merged = merge_rank_findings({0: record(6), 1: record(4)})
    (f,) = merged
    assert f.rule == "rank-conditional-step" and "rank 0: 6, rank 1: 4" in f.evidence[0]
    assert merge_rank_findings({0: record(6), 1: record(6)}) == []

"""Merging the ranks' doctor findings; rank-conditional-step from differing step counts."""

from __future__ import annotations

from torchscalpel.doctor.ranks import merge_rank_findings
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.record import RunRecord, StepRecord


def record(steps: int, *findings: Finding, micro: int = 1) -> RunRecord:
    return RunRecord(
        status="complete",
        step_kind="optimizer",
        steps=[StepRecord(index=i, micro_batches=micro) for i in range(steps)],
        findings=[f.to_dict() for f in findings],
    )


SAME = Finding(
    rule="ddp-no-distributed-sampler",
    severity=Severity.ERROR,
    message="same data",
    location=Location(file="t.py", line=3),
)
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


def test_under_a_launcher_every_rank_gets_the_same_fixed_window(tmp_path, monkeypatch) -> None:
    """A rank stopped by its own clock would leave the others blocked in a collective."""
    from torchscalpel.doctor.api import diagnose
    from torchscalpel.doctor.window import RANK_STEPS
    from torchscalpel.runtime.target import Target

    script = tmp_path / "quick.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(2, 1)\no = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "torch.manual_seed(0)\nfor _ in range(100):\n    o.zero_grad(); m(torch.ones(4, 2)).sum().backward(); o.step()\n"
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    record, _ = diagnose(Target(script=script), warmup=2, static=False, nan_rerun=False)
    assert record.status == "stopped" and len(record.steps) == 2 + RANK_STEPS
    monkeypatch.delenv("WORLD_SIZE")
    record, _ = diagnose(Target(script=script), warmup=2, static=False, nan_rerun=False)
    assert len(record.steps) > 2 + RANK_STEPS  # alone, the default window is longer (and capped by time only)

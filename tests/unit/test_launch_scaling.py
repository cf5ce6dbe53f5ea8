"""The multi-rank verdicts of ``scalpel launch --profile``: communication bound, and a per-rank batch the split
shrank (global batch kept while the world grew), each with its evidence and fix, in the table and the page."""

from __future__ import annotations

from torchscalpel.distributed.scaling import batch_for_share, comm_share, scaling_verdicts
from torchscalpel.report.launch_page import render
from torchscalpel.report.launch_terminal import table as format_table


def _rows(comm: float, compute: float, ranks: int = 2) -> list[dict]:
    return [
        {
            "rank": r,
            "status": "complete",
            "steps": 5,
            "step_ms": comm + compute,
            "collective_ms": comm,
            "compute_ms": compute,
            "data_ms": 0.1,
        }
        for r in range(ranks)
    ]


def test_communication_bound_fires_with_evidence_and_the_batch_that_would_fix_it() -> None:
    (v,) = scaling_verdicts(_rows(6.0, 4.0), batch=8)
    assert v["rule"] == "communication-bound" and v["ranks"] == [0, 1]
    assert v["message"].startswith(
        "the step is communication bound: the ranks spend 60% of each profiled step"
    )
    assert v["evidence"][0] == "rank 0: 6.0 ms in collectives of 10.0 ms per profiled step (60%)"
    # compute grows with the batch, the all-reduce does not: 6 / (6 + 4k) = 25% at k = 4.5
    assert batch_for_share(8, 6.0, 4.0) == 36
    assert v["fix"].startswith("Collectives fall under 25% of a step near a per-rank batch of 36.")
    assert comm_share(_rows(6.0, 4.0)[0]) == 0.6


def test_a_compute_bound_step_or_one_rank_or_a_missing_figure_says_nothing() -> None:
    assert scaling_verdicts(_rows(1.0, 9.0), batch=8) == []
    assert scaling_verdicts(_rows(3.9, 6.1), batch=8) == []  # just under 40%
    assert scaling_verdicts(_rows(4.0, 6.0), batch=8)[0]["rule"] == "communication-bound"
    assert scaling_verdicts(_rows(6.0, 4.0, ranks=1), batch=8) == []
    rows = _rows(6.0, 4.0)
    rows[1]["collective_ms"] = None
    assert scaling_verdicts(rows, batch=8) == []


def test_a_per_rank_batch_shrunk_by_the_split_is_named_with_the_earlier_launch() -> None:
    history = [{"script": "/s/train.py", "world": 1, "batch": 16, "lr": 0.01}]
    (v,) = scaling_verdicts(_rows(3.5, 6.5), batch=8, script="/s/train.py", history=history)
    assert v["rule"] == "per-rank-batch-split"
    assert v["message"].startswith(
        "the split shrank the per-rank batch from 16 to 8: global batch 16 kept while the ranks went from 1 to 2"
    )
    assert v["evidence"][0] == (
        "earlier launch of this script: 1 rank(s) x per-rank batch 16; this launch: 2 ranks x per-rank batch 8"
    )
    assert "model.no_sync()" in v["fix"] and "Keep the per-rank batch at 16" in v["fix"]
    # the global batch changed (not a split), or another script, or collectives a small share: no split verdict
    assert scaling_verdicts(_rows(3.5, 6.5), batch=16, script="/s/train.py", history=history) == []
    assert scaling_verdicts(_rows(3.5, 6.5), batch=8, script="/s/other.py", history=history) == []
    assert scaling_verdicts(_rows(1.0, 9.0), batch=8, script="/s/train.py", history=history) == []
    # comm bound and split: the split explains it, said once
    (both,) = scaling_verdicts(_rows(7.0, 3.0), batch=8, script="/s/train.py", history=history)
    assert both["rule"] == "per-rank-batch-split"


def test_the_verdict_is_in_the_terminal_table_and_leads_the_page() -> None:
    verdicts = scaling_verdicts(_rows(6.0, 4.0), batch=8, straggler=1)
    merged = {"ranks": _rows(6.0, 4.0), "findings": [], "straggler": None, "verdicts": verdicts}
    table = format_table(merged)
    assert "[warning] communication-bound: the step is communication bound" in table
    assert "    rank 1 is the straggler: the others' collective time includes waiting for it" in table
    assert "  fix: Collectives fall under 25%" in table
    page = render(merged)
    verdict = page.split('<section id="verdict">', 1)[1].split("</section>", 1)[0]
    assert "the step is communication bound" in verdict and "<pre>Collectives fall under 25%" in verdict

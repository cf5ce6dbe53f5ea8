"""``scalpel doctor --nproc N``: every rank runs under the doctor through ``scalpel launch --doctor``;
this merges the ranks' findings and compares what the ranks did (rule ``rank-conditional-step``)."""

from __future__ import annotations

import os
from pathlib import Path

from torchscalpel.doctor.registry import rank_findings
from torchscalpel.doctor.rules.dist_static import RANK_CONDITIONAL_STEP
from torchscalpel.findings import Finding
from torchscalpel.record import RunRecord


def merge_rank_findings(records: dict[int, RunRecord]) -> list[Finding]:
    """One finding per (rule, location or message) over all ranks, tagged with the first rank that
    raised it and listing the others; plus ``rank-conditional-step`` when ranks stepped differently."""
    merged: dict[tuple[str, str], tuple[Finding, list[int]]] = {}
    for rank, record in sorted(records.items()):
        for data in record.findings:
            f = Finding.from_dict(data)
            key = (f.rule, str(f.location) if f.location else f.message)
            if key not in merged:
                f.rank = rank
                merged[key] = (f, [rank])
            else:
                merged[key][1].append(rank)
    out = []
    for f, ranks in merged.values():
        if len(ranks) > 1:
            f.evidence.append(f"seen on ranks {', '.join(map(str, ranks))}")
            f.rank = None if len(ranks) == len(records) else f.rank
        out.append(f)
    out.extend(step_mismatch(records))
    return rank_findings(out)


def _counts(record: RunRecord) -> dict[str, int]:
    return {
        "optimizer steps": len(record.steps) if record.step_kind == "optimizer" else 0,
        "backward calls": sum(s.micro_batches for s in record.steps),
    }


def step_mismatch(records: dict[int, RunRecord]) -> list[Finding]:
    """``rank-conditional-step`` when ranks that ran to the same end did different numbers of steps."""
    if len(records) < 2:
        return []
    counts = {rank: _counts(rec) for rank, rec in records.items()}
    found = []
    for what in ("optimizer steps", "backward calls"):
        values = {rank: c[what] for rank, c in counts.items()}
        if len(set(values.values())) > 1:
            shown = ", ".join(f"rank {r}: {n}" for r, n in sorted(values.items()))
            found.append(
                RANK_CONDITIONAL_STEP.finding(
                    f"The ranks did not run the same number of {what}: some of them run only on some ranks, so "
                    "replicas diverge and collectives can hang.",
                    evidence=[
                        shown,
                        *(
                            f"rank {r} ended {rec.status}" + (f": {rec.error}" if rec.error else "")
                            for r, rec in sorted(records.items())
                        ),
                    ],
                    fix="# run backward and optimizer.step() on every rank; guard only logging/saving:\n"
                    "if dist.get_rank() == 0:\n    print(loss.item())",
                )
            )
            break
    return found


def across_rank_findings(out: Path) -> list[Finding]:
    """What the launcher found by comparing the ranks of a launch into ``out``: the hang watch's
    (``collective-mismatch``, ``rank-hang``: first, they explain the rest) then the cross-rank rules
    (:mod:`torchscalpel.distributed.rankrules`), as findings tagged with their rank when only one is named."""
    from torchscalpel.distributed.hangwatch import watch_findings
    from torchscalpel.distributed.rankrules import rank_findings as cross_rank_findings

    found = []
    for data in watch_findings(out) + cross_rank_findings(out / "watch"):
        f = Finding.from_dict(data)
        ranks = sorted(data.get("ranks") or [])
        if len(ranks) == 1:
            f.rank = ranks[0]
        elif ranks and not any(line.startswith("ranks ") for line in f.evidence):
            f.evidence.append(f"ranks {', '.join(map(str, ranks))}")
        found.append(f)
    return found


MERGED_RANKS_ENV = "SCALPEL_DOCTOR_MERGED"
"""Set to 1 for the ranks of ``doctor --nproc``: each rank prints a one-line summary, the parent the merged list."""


def run_ranks(
    script: Path, script_args: list[str], *, nproc: int, steps: int | str | None, out: Path
) -> tuple[int, dict[int, RunRecord]]:
    """Launch ``nproc`` ranks under ``scalpel launch --doctor`` (its hang watch and collective check
    included); returns (exit code, records by rank). :func:`across_rank_findings` reads what the
    launcher found."""
    from torchscalpel.distributed.launch import build_parser, launch, watch_options
    from torchscalpel.distributed.options import LaunchOptions
    from torchscalpel.distributed.rankmerge import load_rank_records

    argv = [
        "--nproc",
        str(nproc),
        "--doctor",
        "--steps",
        str(steps or "auto"),
        "--out",
        str(out),
        "--",
        str(script),
        *script_args,
    ]
    options = LaunchOptions.from_args(build_parser().parse_args(argv))
    previous = os.environ.get(MERGED_RANKS_ENV)
    os.environ[MERGED_RANKS_ENV] = "1"  # torchrun's workers inherit it
    try:
        code = launch(options, out_dir=out, watch=watch_options(options, out))
    finally:
        if previous is None:
            os.environ.pop(MERGED_RANKS_ENV, None)
        else:
            os.environ[MERGED_RANKS_ENV] = previous
    records = load_rank_records(out)
    return code, records

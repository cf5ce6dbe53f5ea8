"""Why a multi-rank step is slow, from the merged rank records of ``scalpel launch --profile``.

Two verdicts, each with its evidence and a fix:

- ``communication-bound``: the ranks spend at least :data:`COMM_BOUND_SHARE` of a profiled step in collectives
  (the ``collective ms`` of :func:`torchscalpel.distributed.rankmerge.rank_row`, the same measure as the
  straggler rule: gloo's wall time, waits included).
- ``per-rank-batch-split``: the split shrank the per-rank batch: an earlier launch of the same script (its batch
  history, :mod:`torchscalpel.distributed.rankrules`) ran fewer ranks with a larger per-rank batch and the same
  global batch, and now collectives take at least :data:`SPLIT_SHARE` of each step: the compute per rank
  shrank with the batch, the gradient all-reduce did not. This one explains the first, which is then not said
  again.

The fix says which per-rank batch brings collectives under :data:`TARGET_SHARE`, on the stated assumption that
compute grows with the batch and a collective's bytes do not (gradients are the size of the model). A verdict
needs two ranks or more, each with a collective and a compute figure; without them nothing is said.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from torchscalpel.findings import Finding, Severity

COMM_BOUND_SHARE = 0.4
"""Collectives' share of a profiled step from which the step is called communication bound. Below half, because
the compute figure of a profiled step carries the profiler's own overhead: on 2 gloo ranks a script whose plain
step took 175 ms took 270 ms profiled with 132 ms in collectives, 49% of the window for 75% of a real step (a DDP
4096 -> 2048 Linear at per-rank batch 8)."""
SPLIT_SHARE = 0.3
"""Collectives' share from which a per-rank batch shrunk by the split is called the cause."""
TARGET_SHARE = 0.25
"""The share the fix aims for (the per-rank batch it names)."""
SLUGS = ("communication-bound", "per-rank-batch-split")


def comm_share(row: dict[str, Any]) -> float | None:
    """Collective time over collective + compute time per profiled step (None without both figures)."""
    comm, compute = row.get("collective_ms"), row.get("compute_ms")
    if comm is None or compute is None or comm < 0 or compute < 0 or comm + compute <= 0:
        return None
    return float(comm) / float(comm + compute)


def batch_for_share(batch: int, comm_ms: float, compute_ms: float, share: float = TARGET_SHARE) -> int | None:
    """The per-rank batch at which collectives would be ``share`` of the step, compute scaling with the batch
    (None when there is no compute to scale)."""
    if compute_ms <= 0 or batch <= 0:
        return None
    return max(batch, math.ceil(batch * comm_ms * (1.0 - share) / (share * compute_ms)))


def _finding(slug: str, message: str, evidence: list[str], fix: str, ranks: list[int]) -> dict[str, Any]:
    return {
        **Finding(
            rule=slug, severity=Severity.WARNING, message=message, evidence=evidence, fix=fix, source="launch"
        ).to_dict(),
        "ranks": ranks,
    }


def per_rank_batch(records_samples: dict[int, list[int]]) -> int | None:
    """The per-rank batch: the median samples per measured step over every rank (None when no rank counted)."""
    values = [s for samples in records_samples.values() for s in samples if s]
    return int(statistics.median(values)) if values else None


def scaling_verdicts(
    rows: list[dict[str, Any]],
    *,
    batch: int | None,
    script: str | None = None,
    history: list[dict[str, Any]] | None = None,
    straggler: int | None = None,
) -> list[dict[str, Any]]:
    """The verdicts for a launch's rank rows (``merged["ranks"]``), its per-rank batch, and the script's batch
    history before this launch (rows ``{"script", "world", "batch", "lr"}``). ``straggler``: the rank the
    straggler rule named, whose lateness the other ranks' collective time includes."""
    shares = {int(r["rank"]): comm_share(r) for r in rows}
    known = {rank: s for rank, s in shares.items() if s is not None}
    world = len(rows)
    if world < 2 or len(known) < world:
        return []
    share = statistics.median(known.values())
    comm = statistics.median(float(r["collective_ms"]) for r in rows)
    compute = statistics.median(float(r["compute_ms"]) for r in rows)
    evidence = [
        f"rank {r['rank']}: {float(r['collective_ms']):.1f} ms in collectives of "
        f"{float(r['collective_ms']) + float(r['compute_ms']):.1f} ms per profiled step ({known[int(r['rank'])]:.0%})"
        for r in rows
    ]
    if straggler is not None:
        evidence.append(
            f"rank {straggler} is the straggler: the others' collective time includes waiting for it; "
            "fix it first (see the straggler line)"
        )
    target = batch_for_share(batch, comm, compute) if batch else None
    ranks = sorted(known)
    earlier = _split_from(history or [], script, world, batch)
    if earlier is not None and share >= SPLIT_SHARE and batch:
        old_world, old_batch = int(earlier["world"]), int(earlier["batch"])
        k = max(2, math.ceil(old_batch / batch))
        message = (
            f"the split shrank the per-rank batch from {old_batch} to {batch}: global batch {batch * world} kept "
            f"while the ranks went from {old_world} to {world}, so each rank computes {old_batch / batch:g}x less "
            f"per step while its all-reduce stays the size of the model; collectives are now {share:.0%} of a step"
        )
        evidence.insert(
            0,
            f"earlier launch of this script: {old_world} rank(s) x per-rank batch {old_batch}; "
            f"this launch: {world} ranks x per-rank batch {batch}",
        )
        fix = (
            f"Keep the per-rank batch at {old_batch} (global batch {old_batch * world}; scale the lr by "
            f"{old_batch * world}/{batch * world}), or accumulate {k} micro-batches of {batch} per optimizer step "
            "and all-reduce once:\nfor i, (x, y) in enumerate(loader):\n"
            f"    ctx = model.no_sync() if (i + 1) % {k} else contextlib.nullcontext()\n"
            f"    with ctx:\n        (loss_fn(model(x), y) / {k}).backward()\n"
            f"    if (i + 1) % {k} == 0:\n        optimizer.step(); optimizer.zero_grad()"
        )
        if target is not None:
            fix = (
                f"Collectives fall under {TARGET_SHARE:.0%} of a step near a per-rank batch of {target}. "
                + fix
            )
        return [_finding(SLUGS[1], message, evidence, fix, ranks)]
    if share < COMM_BOUND_SHARE:
        return []
    message = (
        f"the step is communication bound: the ranks spend {share:.0%} of each profiled step in collectives "
        f"({comm:.1f} ms) against {compute:.1f} ms of compute"
    )
    if batch:
        message += f" at a per-rank batch of {batch}"
    fix = (
        "Give each collective more compute: a larger per-rank batch, or gradient accumulation under "
        "model.no_sync() (one all-reduce every k micro-batches); fewer ranks on one machine; for DDP, "
        "bucket_cap_mb large enough to overlap the all-reduce with backward; for FSDP, reshard_after_forward=False "
        "on the blocks (one all-gather per block per step instead of two)."
    )
    if target is not None:
        fix = f"Collectives fall under {TARGET_SHARE:.0%} of a step near a per-rank batch of {target}. " + fix
    return [_finding(SLUGS[0], message, evidence, fix, ranks)]


def _split_from(
    history: list[dict[str, Any]], script: str | None, world: int, batch: int | None
) -> dict[str, Any] | None:
    """The latest earlier launch of ``script`` with fewer ranks, a larger per-rank batch and this global batch."""
    if not batch or not script:
        return None
    for old in reversed(history):
        try:
            old_world, old_batch = int(old["world"]), int(old["batch"])
        except (KeyError, TypeError, ValueError):
            continue
        if (
            old.get("script") == script
            and old_world < world
            and old_batch > batch
            and old_world * old_batch == world * batch
        ):
            return old
    return None


def format_verdicts(verdicts: list[dict[str, Any]]) -> list[str]:
    """Terminal lines: each verdict, its evidence and its fix."""
    lines = []
    for v in verdicts:
        lines.append(f"[{v.get('severity', 'warning')}] {v.get('rule')}: {v.get('message', '')}")
        lines.extend(f"    {e}" for e in v.get("evidence") or [])
        fix = str(v.get("fix") or "")
        if fix:
            first, *rest = fix.splitlines()
            lines.append(f"  fix: {first}")
            lines.extend(f"    {line}" for line in rest)
    return lines

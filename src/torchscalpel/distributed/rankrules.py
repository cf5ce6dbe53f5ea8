"""Checks that need every rank's view, judged by the launcher from ``rank-R.facts.json``.

The ranks only record (:mod:`torchscalpel.runtime.rankfacts`); this module compares. Findings use
the doctor's format (:class:`~torchscalpel.findings.Finding`) and go first into
``launch.json`` under ``scalpel launch --doctor``:

- ``distributed-sampler-wrong-world``: a ``DistributedSampler`` whose ``num_replicas``/``rank``
  are not the job's world size/rank (hard-coded values: ranks read the same shard or skip data);
- ``ddp-accumulation-without-no-sync``: several DDP forwards per optimizer step that all
  all-reduce (gradient accumulation without ``no_sync()``), with the bytes sent for nothing;
- ``identical-random-streams``: every rank's generators that a training step draws from in the same
  state after step 2 (the same dropout masks and augmentations on every rank; a DataLoader's per-epoch
  base-seed draw between the steps is left out: ``rankfacts.RankFacts.on_loader_iter``);
- ``ddp-device-ids-not-local-rank``: ``device_ids`` that are not ``[LOCAL_RANK]``;
- ``accumulated-loss-not-divided``: under DDP, several backward passes per optimizer step whose loss
  graph ends in no division or multiplication (the summed gradient is k times the mean: k times the
  learning rate); steps that took a closure (LBFGS) are not accumulation and are left out;
- ``global-batch`` (info): per-rank batch x world = the global batch, with the optimizer's lr; and
  ``batch-not-rescaled-for-world`` (warning) when an earlier launch of the same script (into any
  folder: ``scalpel launch`` makes a new one each time) ran at another world size with the same per-rank
  batch and the same lr (the global batch changed, the lr did not). One history per script, in the user's
  cache (:func:`history_path`), keeps one line per launch for this;
- ``process-group-before-init``: the user's script called ``dist.get_rank()``/``get_world_size()``/... before
  ``init_process_group`` (torch raises "Default process group has not been initialized").
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from pathlib import Path
from typing import Any

from torchscalpel.fileio import user_cache_dir
from torchscalpel.findings import Finding, Severity
from torchscalpel.runtime.hang_files import FACTS_GLOB
from torchscalpel.units import fmt_bytes

SLUGS = (
    "distributed-sampler-wrong-world",
    "ddp-accumulation-without-no-sync",
    "identical-random-streams",
    "ddp-device-ids-not-local-rank",
    "accumulated-loss-not-divided",
    "batch-not-rescaled-for-world",
    "process-group-before-init",
)
INFO_SLUGS = ("global-batch",)
HISTORY = "batch-history.json"


def load_facts(folder: Path) -> dict[int, dict[str, Any]]:
    """``rank-R.facts.json`` by rank (unreadable files are skipped)."""
    out = {}
    for path in sorted(folder.glob(FACTS_GLOB)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[int(data["rank"])] = data
    return out


def _finding(
    slug: str, severity: Severity, message: str, evidence: list[str], fix: str, ranks: list[int]
) -> dict[str, Any]:
    return {
        **Finding(
            rule=slug, severity=severity, message=message, evidence=evidence, fix=fix, source="launch"
        ).to_dict(),
        "ranks": ranks,
    }


def sampler_findings(facts: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Samplers whose replicas/rank disagree with the job."""
    bad = []
    for rank, data in sorted(facts.items()):
        for s in data.get("samplers", []):
            if s["num_replicas"] != s["world"] or s["rank"] != s["actual_rank"]:
                bad.append((rank, s))
    if not bad:
        return []
    rank, s = bad[0]
    message = (
        f"DistributedSampler(num_replicas={s['num_replicas']}, rank={s['rank']}) on rank {rank} of a "
        f"{s['world']}-rank job: "
        + (
            "ranks read overlapping shards"
            if s["num_replicas"] < s["world"] or s["rank"] != s["actual_rank"]
            else "part of the data is never read"
        )
    )
    evidence = [
        f"rank {r}: num_replicas={x['num_replicas']} rank={x['rank']} (job: world {x['world']}, rank "
        f"{x['actual_rank']}) at {x['site']}"
        for r, x in bad
    ]
    return [
        _finding(
            SLUGS[0],
            Severity.ERROR,
            message,
            evidence,
            "Leave num_replicas and rank out: DistributedSampler(dataset) reads them from the process group.",
            sorted({r for r, _ in bad}),
        )
    ]


def no_sync_findings(facts: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Accumulation steps where every micro-batch all-reduced."""
    hits = []
    for rank, data in sorted(facts.items()):
        steps = [synced for synced, _ in data.get("steps", [])[1:]] or [s for s, _ in data.get("steps", [])]
        if not data.get("ddp") or not steps:
            continue
        per_step = statistics.median(steps)
        if per_step > 1:
            hits.append((rank, per_step, data["ddp"][0]))
    if not hits:
        return []
    rank, k, ddp = hits[0]
    wasted = (k - 1) * ddp["grad_bytes"]
    message = (
        f"DDP all-reduces the gradients on every micro-batch: {k:g} synchronising backward passes per "
        f"optimizer step where 1 is needed (gradient accumulation without no_sync())"
    )
    evidence = [f"rank {r}: median {n:g} synced DDP forwards per optimizer step" for r, n, _ in hits]
    evidence.append(
        f"{k - 1:g} extra all-reduces of {fmt_bytes(ddp['grad_bytes'])} of gradients per step: "
        f"{fmt_bytes(int(wasted))} sent for nothing per step per rank (first DDP forward at {ddp['site']})"
    )
    fix = (
        "with model.no_sync() if not last_micro_batch else contextlib.nullcontext():\n"
        "    loss = model(x).loss / accum_steps\n    loss.backward()"
    )
    return [_finding(SLUGS[1], Severity.WARNING, message, evidence, fix, [r for r, _, _ in hits])]


def rng_findings(facts: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank drawing the same random numbers."""
    digests = {r: d["rng"] for r, d in facts.items() if d.get("rng") is not None}
    if len(digests) < 2 or len(digests) < len(facts):
        return []  # a rank that never reached step 2
    same = [
        name
        for name in ("torch", "numpy", "python")
        if all(name in d for d in digests.values()) and len({d[name] for d in digests.values()}) == 1
    ]
    if "torch" not in same:
        return []
    ranks = sorted(digests)
    message = (
        f"every rank's random stream is the same ({', '.join(same)} generators, drawn from every step, "
        f"identical after step 2 on ranks "
        f"{', '.join(map(str, ranks))}): dropout masks and random augmentations repeat on every rank"
    )
    fix = (
        "Seed per rank after the model is built (DDP broadcasts rank 0's weights anyway):\n"
        "torch.manual_seed(base_seed + rank); random.seed(base_seed + rank); np.random.seed(base_seed + rank)"
    )
    return [
        _finding(
            SLUGS[2],
            Severity.WARNING,
            message,
            [f"{n} state digest equal on all {len(ranks)} ranks" for n in same],
            fix,
            ranks,
        )
    ]


def device_id_findings(facts: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """DDP ``device_ids`` that are not this rank's ``LOCAL_RANK``."""
    bad = []
    for rank, data in sorted(facts.items()):
        local = data.get("local_rank")
        for d in data.get("ddp", []):
            if d.get("device_ids") and local is not None and d["device_ids"] != [local]:
                bad.append((rank, local, d))
    if not bad:
        return []
    rank, local, d = bad[0]
    return [
        _finding(
            SLUGS[3],
            Severity.ERROR,
            f"DDP(device_ids={d['device_ids']}) on rank {rank} whose LOCAL_RANK is {local}: ranks share a device",
            [f"rank {r}: device_ids={x['device_ids']}, LOCAL_RANK={lr} at {x['site']}" for r, lr, x in bad],
            "local_rank = int(os.environ['LOCAL_RANK']); torch.cuda.set_device(local_rank); "
            "DDP(model, device_ids=[local_rank])",
            sorted({r for r, _, _ in bad}),
        )
    ]


def loss_scale_findings(facts: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Accumulation (k > 1 backward passes per DDP optimizer step) on a loss that was never divided."""
    hits = []
    for rank, data in sorted(facts.items()):
        rows = [b for b in data.get("backward", []) if not b[2]]  # closure steps re-evaluate, not accumulate
        rows = rows[1:] or rows  # the first step may hold a warm-up or eval backward
        if not data.get("ddp") or not rows:
            continue
        k = statistics.median(r[0] for r in rows)
        if k > 1 and all(r[1] == 0 for r in rows):
            hits.append((rank, k, rows[-1][3], data.get("lr")))
    if not hits:
        return []
    _, k, _, lr = hits[0]
    lr_text = f"; the optimizer's lr is {lr:g}" if lr is not None else ""
    message = (
        f"the loss is not divided by the accumulation steps: {k:g} backward passes per optimizer step "
        f"under DDP on a loss that is never scaled, so each step applies {k:g}x the mean gradient"
    )
    evidence = [
        f"rank {r}: median {n:g} backward passes per optimizer step, none through a division or "
        f"multiplication (graph root {rt})"
        for r, n, rt, _ in hits
    ]
    evidence.append(
        f"a loss with reduction='sum' or an lr already divided by {k:g} is deliberate: then ignore "
        f"this{lr_text}"
    )
    fix = "loss = loss_fn(model(x), y) / accum_steps\nloss.backward()"
    return [_finding(SLUGS[4], Severity.WARNING, message, evidence, fix, [r for r, _, _, _ in hits])]


def before_init_findings(facts: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Process-group calls the user's code made before ``init_process_group``."""
    hits = [(r, c) for r, d in sorted(facts.items()) for c in d.get("before_init", [])]
    if not hits:
        return []
    rank, call = hits[0]
    return [
        _finding(
            SLUGS[6],
            Severity.ERROR,
            f"dist.{call['call']}() at {call['site']} runs before init_process_group on rank {rank}: "
            f"there is no process group yet",
            [f"rank {r}: dist.{c['call']}() at {c['site']} before init_process_group" for r, c in hits],
            "Call dist.init_process_group(backend) first (then torch.cuda.set_device(local_rank) on GPUs); "
            "before it, read the rank from os.environ['RANK'] / ['LOCAL_RANK'].",
            sorted({r for r, _ in hits}),
        )
    ]


def batch_entry(facts: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """This launch's script, world, per-rank batch and lr (rank 0's view); None without a DDP forward."""
    data = facts.get(0) or facts[min(facts)]
    if data.get("batch") is None:
        return None
    return {
        "script": data.get("script"),
        "world": int(data["world"]),
        "batch": data["batch"],
        "lr": data.get("lr"),
    }


def batch_findings(entry: dict[str, Any] | None, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The global batch (info), and a warning when an earlier launch of the script changed only the world."""
    if entry is None:
        return []
    lr = f"{entry['lr']:g}" if entry.get("lr") is not None else "unknown"
    out = [
        _finding(
            INFO_SLUGS[0],
            Severity.INFO,
            f"global batch {entry['batch'] * entry['world']} = per-rank batch {entry['batch']} x "
            f"{entry['world']} ranks, optimizer lr {lr}",
            [f"script {entry['script']}"],
            "If the world size changes, scale the lr with the global batch (or keep the global batch).",
            list(range(entry["world"])),
        )
    ]
    for old in reversed(history):
        if (
            old.get("script") == entry["script"]
            and old.get("world") != entry["world"]
            and old.get("batch") == entry["batch"]
            and old.get("lr") == entry["lr"]
        ):
            before, now = old["batch"] * old["world"], entry["batch"] * entry["world"]
            out.insert(
                0,
                _finding(
                    SLUGS[5],
                    Severity.WARNING,
                    f"the world size changed from {old['world']} to {entry['world']} ranks with the same per-rank "
                    f"batch {entry['batch']} and the same lr {lr}: the global batch went from {before} to {now} "
                    f"and the learning rate did not follow",
                    [
                        f"earlier launch of this script: world {old['world']}, per-rank batch {old['batch']}, lr {lr}",
                        f"this launch: world {entry['world']}, per-rank batch {entry['batch']}, lr {lr}",
                    ],
                    f"Scale the lr by {now}/{before} (linear rule) or set the per-rank batch to "
                    f"{before // entry['world'] if before % entry['world'] == 0 else 'global/world'} to keep the global batch.",
                    list(range(entry["world"])),
                ),
            )
            break
    return out


def history_path(script: str) -> Path:
    """The batch history of ``script`` (its absolute path as the ranks recorded it): one file per script under
    ``$TORCHSCALPEL_HISTORY_DIR``, else the user's cache (``batch-history/``), whatever ``--out`` each launch used."""
    folder = Path(os.environ.get("TORCHSCALPEL_HISTORY_DIR") or user_cache_dir() / "batch-history")
    return folder / f"{hashlib.sha256(script.encode('utf-8', 'surrogateescape')).hexdigest()[:24]}.json"


def _is_row(row: Any) -> bool:
    """A history line as :func:`batch_entry` writes it (the file is the user's, but a torn or edited one is skipped)."""
    return (
        isinstance(row, dict)
        and isinstance(row.get("script"), str)
        and all(type(row.get(k)) is int and row[k] > 0 for k in ("world", "batch"))
        and (row.get("lr") is None or type(row["lr"]) in (int, float))
    )


def _history(path: Path) -> list[dict[str, Any]]:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [row for row in rows if _is_row(row)] if isinstance(rows, list) else []


def record_launch(path: Path, entry: dict[str, Any] | None) -> None:
    """Append this launch to the history file ``path`` (the last 20 kept)."""
    if entry is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(json.dumps([*_history(path), entry][-20:]) + "\n")
    except OSError:
        pass  # a read-only cache: the next launch just has no history


def _history_file(folder: Path, entry: dict[str, Any] | None) -> Path:
    script = entry.get("script") if entry else None
    return history_path(script) if isinstance(script, str) and script else folder / HISTORY


def launch_history(folder: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(this launch's batch entry, the earlier launches of its script): read before :func:`rank_findings`
    records this one (the scaling verdicts compare with the launches before it)."""
    facts = load_facts(folder)
    entry = batch_entry(facts) if facts else None
    return entry, _history(_history_file(folder, entry))


def rank_findings(folder: Path) -> list[dict[str, Any]]:
    """Every cross-rank check over the facts in ``folder`` (and this launch recorded in its script's batch
    history)."""
    facts = load_facts(folder)
    if not facts:
        return []
    entry = batch_entry(facts)
    history = _history_file(folder, entry)
    batch = batch_findings(entry, _history(history))
    record_launch(history, entry)
    return [
        *before_init_findings(facts),
        *sampler_findings(facts),
        *device_id_findings(facts),
        *no_sync_findings(facts),
        *loss_scale_findings(facts),
        *rng_findings(facts),
        *batch,
    ]

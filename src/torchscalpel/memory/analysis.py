"""``record.sections["memory"]``: the peak by category and owner, growth, and the out-of-memory post-mortem.

Everything here reads what the observer and the tracker measured; nothing is re-measured. The top
cause is the story a reader needs first: memory that grows across steps (when it does, and the growth
is a real share of what was live), fragmentation (CUDA, reserved memory that is free but in pieces),
else the largest category when the limit was crossed (or at the peak).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchscalpel.errors import ScalpelError
from torchscalpel.memory.growth import find_growth
from torchscalpel.memory.ladder import build_ladder, plan_numbers
from torchscalpel.runtime.memory_categories import BEFORE_TRAINING, CATEGORIES, EVALUATION
from torchscalpel.runtime.module_names import split_display_name

if TYPE_CHECKING:
    from torchscalpel.memory.observer import MemoryObserver

SECTION_VERSION = "1.0"
TOP_SITES = 10
TOP_MODULES = 12
TRAINING_PHASES = ("forward", "backward")
"""Phases whose temporaries belong to the batch's training step (see build_section)."""
GROWTH_SHARE = 0.25
"""Growth is the top cause when what it kept is at least this share of the live memory."""

CAUSE_TEXT = {
    "activations": "activations saved for backward",
    "optimizer_state": "optimizer state",
    "parameters": "parameters",
    "gradients": "gradients",
    "temporaries": "temporaries",
    "growth": "memory that grows across steps",
    "fragmentation": "allocator fragmentation",
    "data_preparation": "data preparation before training",
}


def _top(d: dict[str, int], n: int) -> list[dict[str, Any]]:
    return [
        {"name": k, "bytes": v} for k, v in sorted(d.items(), key=lambda kv: kv[1], reverse=True)[:n] if v > 0
    ]


def by_block(by_module: dict[str, int], labels: dict[str, str] | None = None) -> dict[str, int]:
    """Module totals rolled up to the first indexed level (``blocks.3.attn`` -> ``blocks.3``): per repeated block.

    Names are the tracker's display names (``blocks.3 (Block)``): the class a name carries stays on its
    block's key, so ``blocks.3.attn`` and ``blocks.3 (Block)`` roll up to one ``blocks.3 (Block)``;
    ``labels`` (the tracker's ``index_labels``) names a block that saved nothing itself.
    """
    keys: dict[str, str] = dict(labels or {})
    sums: dict[str, int] = {}
    for name, n in by_module.items():
        path, cls = split_display_name(name)
        parts = path.split(".")
        cut = next((i + 1 for i, p in enumerate(parts) if p.isdigit()), len(parts))
        key = ".".join(parts[:cut])
        if cut == len(parts) and cls is not None:
            keys[key] = f"{key} ({cls})"
        elif cut == len(parts) and key not in keys:
            keys[key] = name
        sums[key] = sums.get(key, 0) + n
    return {keys.get(k, k): v for k, v in sums.items()}


def _before_training(before: dict[str, Any] | None, training_peak: int) -> dict[str, Any] | None:
    """The peak before training, kept only when it was higher than the training peak (else it says nothing)."""
    if not before or int(before.get("total", 0)) <= training_peak:
        return None
    return {
        "total": before["total"],
        "op": before.get("op"),
        "site": before.get("site"),
        "by_category": before.get("by_category", {}),
        "sites": _top(before.get("by_site", {}), TOP_SITES),
    }


def top_cause(
    by_category: dict[str, int],
    growth: dict[str, Any],
    fragmentation: dict[str, Any] | None,
    live: int,
    *,
    before_training: bool = False,
    kept_at_oom: int = 0,
) -> str:
    """The cause to name first (a key of :data:`CAUSE_TEXT`).

    ``before_training``: the limit was crossed before the model's first training forward, or (no limit)
    the peak then was higher than the training peak: data preparation (a dataset built as tensors, a
    float64 copy) is the cause, and no training-step fix changes it. ``kept_at_oom``: activations saved in
    an earlier step still live at the out-of-memory (graphs kept across steps; growth, even when too few
    step ends were measured to fit its slope).
    """
    if before_training:
        return "data_preparation"
    if kept_at_oom >= GROWTH_SHARE * max(1, live):
        return "growth"
    kept = (growth.get("kept") or {}).get("activations", 0)
    grown = growth.get("per_step", 0) * max(1, growth.get("steps", 1))
    if growth.get("per_step") and max(kept, grown) >= GROWTH_SHARE * max(1, live):
        return "growth"
    if (
        fragmentation
        and fragmentation.get("share", 0) > 0.3
        and fragmentation.get("largest_free", 0) < (fragmentation.get("request") or 0)
    ):
        return "fragmentation"
    return max(CATEGORIES, key=lambda c: by_category.get(c, 0))


def _request_as_activation(
    by_category: dict[str, int], oom: dict[str, Any] | None
) -> tuple[dict[str, int], str | None]:
    """The categories the cause is chosen from: a request that failed in a training forward counts as an activation.

    Why: the failing op's output is counted live (as a temporary: nothing saved it yet), and so are the
    inputs the op was about to save. When a wide first layer at a large batch crosses the limit, the
    activations saved so far are small next to that one output, and "temporaries" would be named for what
    is an activation problem (checkpointing, micro-batches and a smaller batch are its fixes).
    """
    if not oom or oom.get("phase") != "forward" or not oom.get("request_bytes"):
        return by_category, None
    from torchscalpel.units import fmt_bytes

    moved = min(int(oom["request_bytes"]), int(by_category.get("temporaries", 0)))
    out = dict(by_category)
    out["temporaries"] = out.get("temporaries", 0) - moved
    out["activations"] = out.get("activations", 0) + moved
    return out, (
        f"the failing request ({fmt_bytes(moved)}, an op output of the training forward) is counted as the "
        "activation it was about to become"
    )


def cuda_state() -> dict[str, Any] | None:
    """Allocator cache and fragmentation from ``torch.cuda.memory_stats`` and the segment snapshot (CUDA only)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    stats = torch.cuda.memory_stats()
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    allocated = int(stats.get("allocated_bytes.all.current", 0))
    largest = 0
    try:
        for seg in torch.cuda.memory_snapshot():
            for block in seg.get("blocks", []):
                if block.get("state") == "inactive":
                    largest = max(largest, int(block.get("size", 0)))
    except Exception:
        pass
    free = max(0, reserved - allocated)
    return {
        "reserved": reserved,
        "allocated": allocated,
        "reserved_free": free,
        "share": free / reserved if reserved else 0.0,
        "largest_free": largest,
        "allocated_peak": int(stats.get("allocated_bytes.all.peak", 0)),
        "reserved_peak": int(stats.get("reserved_bytes.all.peak", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
    }


def oom_measured(oom: dict[str, Any]) -> dict[str, Any]:
    """What the tracker measured at an out-of-memory, in the record's ``oom`` shape (the failed request, the bytes
    live and their categories): the part of the section that needs no analysis, so a crash in the analysis
    still keeps it in a record that loads."""
    return {
        "request": {
            "op": oom.get("op"),
            "bytes": oom.get("request_bytes"),
            "site": oom.get("site"),
            "module": oom.get("module"),
            "step": oom.get("step"),
            "phase": oom.get("phase"),
            "device_error": oom.get("device_error"),
        },
        "live": oom.get("total"),
        "by_category": oom.get("by_category", {}),
    }


def build_section(obs: MemoryObserver, record: Any, snapshot: dict[str, str] | None = None) -> dict[str, Any]:
    """The memory section of the Run record (plain JSON)."""
    tr = obs.tracker
    assert tr is not None
    peak = tr.peak_copy or {
        "total": tr.peak,
        "by_category": dict(tr.by_category),
        "by_module": {},
        "by_site": {},
    }
    capacity = obs.limit or _capacity()
    growth = bounded_growth(find_growth(obs.samples, capacity=capacity), obs)
    fragmentation = cuda_state()
    section: dict[str, Any] = {
        "version": SECTION_VERSION,
        "device": tr.device_kind,
        "limit": obs.limit,
        "capacity": capacity,
        "allocations": tr.allocations,
        "peak": {
            "total": tr.peak,
            "breakdown_total": peak.get("total"),
            "step": peak.get("step"),
            "phase": peak.get("phase"),
            "op": peak.get("op"),
            "module": peak.get("module"),
            "by_category": peak.get("by_category", {}),
            "modules": _top(peak.get("by_module", {}), TOP_MODULES),
            "blocks": _top(by_block(peak.get("by_module", {}), tr.index_labels), TOP_MODULES),
            "sites": _top(peak.get("by_site", {}), TOP_SITES),
        },
        "before_training": _before_training(obs.before_training, tr.peak),
        "samples": obs.samples,
        "growth": growth,
        "cuda": fragmentation,
        "end": {"live": tr.total, "by_category": dict(tr.by_category), "largest": tr.live_top(TOP_SITES)},
        "evaluation": evaluation_seen(obs, record, peak.get("phase")),
    }
    where = tr.oom or {}
    live_now = where.get("total", tr.peak)
    by_cat = where.get("by_category") or peak.get("by_category", {})
    if fragmentation is not None and tr.oom is not None:
        fragmentation["request"] = tr.oom.get("request_bytes")
    early = (
        where if tr.oom is not None else (obs.before_training or {}) if section["before_training"] else {}
    ).get("phase") == BEFORE_TRAINING
    cause_cat, note = _request_as_activation(by_cat, tr.oom)
    cause = top_cause(
        cause_cat,
        growth,
        fragmentation,
        live_now,
        before_training=early,
        kept_at_oom=int(where.get("kept_activations") or 0),
    )
    phase = where.get("phase") if tr.oom is not None else peak.get("phase")
    if cause == "temporaries" and phase in TRAINING_PHASES:
        # In a training forward or backward the temporaries are the batch's own: gradients of activations and,
        # under checkpointing, recomputed activations (GPT-2 with gradient_checkpointing_enable() ran out in
        # backward with 81% temporaries). They scale with the batch and have the activations' fixes.
        cause, note = (
            "activations",
            (
                f"temporaries of the training {phase} (gradients of activations, recomputed "
                "activations) scale with the batch as activations do"
            ),
        )
    section["top_cause"] = {"key": cause, "text": CAUSE_TEXT[cause]}
    if note and cause == "activations" and max(CATEGORIES, key=lambda c: by_cat.get(c, 0)) != "activations":
        section["top_cause"]["note"] = note
    if tr.oom is not None:
        section["oom"] = _postmortem(obs, tr.oom, cause, growth, fragmentation, snapshot or {})
        # a bare `except:` (or `except BaseException`) in the script caught the stop and the script went on:
        # the post-mortem is still the crossing's, and the run did not fit
        section["oom"]["caught_by_script"] = getattr(record, "status", None) in ("complete", "stopped")
    return section


BOUNDED_SHARE = 0.9
"""Growth is the bounded optimizer's own when its state's slope is at least this share of the total slope."""


def bounded_growth(growth: dict[str, Any], obs: MemoryObserver) -> dict[str, Any]:
    """Growth that is an optimizer filling a capped state (LBFGS's history) is not named growth: it stops at the cap.

    Why: time_sequence_prediction (LBFGS, history_size 100) was told "grows 7.0 MiB/step: 3410 more steps until
    23.54 GiB" while its history was filling; it stops at 100 pairs. Found from the optimizer's own state and
    settings (``bounded_state``), when the optimizer state's slope over the same steps is the growth.
    """
    bound = getattr(obs, "bounded_state", None)
    if not growth.get("per_step") or not bound:
        return growth
    from torchscalpel.memory.growth import slope

    usable = [s for s in obs.samples if not s.get("warmup")] or obs.samples
    opt = [float((s.get("by_category") or {}).get("optimizer_state", 0)) for s in usable][
        -int(growth["steps"]) :
    ]
    if slope(opt) < BOUNDED_SHARE * growth["per_step"]:
        return growth
    now = int(opt[-1]) if opt else 0
    return {
        **growth,
        "per_step": 0,
        "steps_left": None,
        "sites": [],
        "kept": None,
        "bounded": {
            **bound,
            "grew_per_step": int(growth["per_step"]),
            "now": now,
            "left": max(0, int(bound["cap"]) - now),
        },
    }


def evaluation_seen(obs: MemoryObserver, record: Any, peak_phase: Any) -> dict[str, Any]:
    """Whether the window saw the script evaluate, and when it did not, one plain sentence saying so.

    Why: pytorch/examples mnist trains 938 batches of 64, then tests under ``torch.no_grad()`` in batches of 1000:
    a 20-step window reported 50.9 MiB where the test loop peaks at 302.7 MiB, and a limit "fitting" the
    training step is crossed in evaluation. A run that ended early (stopped, or crossed a limit) before any
    evaluation says so, and how to include it.
    """
    passes = int(getattr(obs, "evaluations", 0))
    out: dict[str, Any] = {"passes": passes, "peak_in_evaluation": peak_phase == EVALUATION, "note": None}
    status = getattr(record, "status", None)
    crossed = obs.tracker is not None and obs.tracker.oom is not None
    if passes == 0 and (status == "stopped" or crossed):
        steps = len(getattr(record, "steps", None) or [])
        # the crossing's own step (0-based, as every step in the record and the output), not a count
        ended = (
            f"crossed the limit in step {obs.tracker.oom.get('step')}"
            if crossed and obs.tracker is not None and obs.tracker.oom is not None
            else f"was stopped after {steps} step(s)"
        )
        out["note"] = (
            f"evaluation not seen: the run {ended} and no model forward under "
            "torch.no_grad() ran; if the script evaluates later (a test loop, often with a larger batch) "
            "its peak can be higher"
            + (
                "; the ladder's 'fits' is the training step's"
                if crossed
                # in a notebook the words are the function's arguments, not the CLI's flags
                else "; run the block through the first evaluation (torchscalpel.memory(steps=None), or a "
                "larger steps=) to measure it"
                if "inprocess" in (getattr(record, "target", None) or {})
                else "; rerun with --until-eval to measure through the first evaluation"
            )
        )
    return out


def _postmortem(
    obs: MemoryObserver,
    oom: dict[str, Any],
    cause: str,
    growth: dict[str, Any],
    fragmentation: dict[str, Any] | None,
    snapshot: dict[str, str],
) -> dict[str, Any]:
    limit: int | None = obs.limit or (fragmentation or {}).get("reserved") or _capacity()
    if limit is None:
        # Not seen in practice: an out-of-memory comes with --memory-limit, the reserved bytes or a device
        # whose size _capacity() reads. Without any of them the ladder has no budget to fit into.
        raise ScalpelError(
            "the memory post-mortem found no memory size to fit into: pass --memory-limit SIZE"
        )
    plan: dict[str, Any] | None = None
    plan_error = None
    # growth and data preparation are fixed in code, not by a plan of the training step
    if obs.plan_observer is not None and cause not in ("growth", "data_preparation"):
        try:
            plan = plan_numbers(obs.plan_observer, int(limit), cause)
        except Exception as exc:  # the ladder still has the measured rungs
            plan_error = f"the plan could not simulate this model: {type(exc).__name__}: {exc}"
    if plan and "error" in plan:
        plan_error, plan = plan["error"], None
    measured = max(int(oom.get("total", 0)), int(obs.tracker.peak if obs.tracker else 0))
    kept = int(oom.get("kept_activations") or 0)
    if cause == "growth" and not growth.get("per_step") and kept:
        # too few step ends for a slope, but graphs from earlier steps are live: the ladder's growth rungs
        # read the kept bytes (per step: over the steps that kept them)
        growth = {
            **growth,
            "per_step": kept // max(1, int(oom.get("step") or 1)),
            "kept": {
                "activations": kept,
                "per_step": kept // max(1, int(oom.get("step") or 1)),
                "losses_kept": 0,
            },
        }
    top_site = next((r["name"] for r in _top(oom.get("by_site", {}), 1)), None)
    ladder = build_ladder(
        measured_peak=measured,
        limit=int(limit),
        plan=plan,
        cause=cause,
        breakdown=oom.get("by_category", {}),
        phase=str(oom.get("phase")),
        growth=growth,
        accumulating=bool(oom.get("accumulating")),
        fragmentation=fragmentation,
        top_site=top_site,
    )
    return {
        **oom_measured(oom),
        "limit": limit,
        "kept_activations": int(oom.get("kept_activations") or 0),
        "modules": _top(oom.get("by_module", {}), TOP_MODULES),
        "sites": _top(oom.get("by_site", {}), TOP_SITES),
        "largest": oom.get("live", [])[:TOP_SITES],
        "plan": plan,
        "plan_error": plan_error,
        "ladder": ladder,
        "snapshot": snapshot,
    }


def write_snapshot(obs: MemoryObserver, oom: dict[str, Any]) -> dict[str, str]:
    """What was live (JSON, any device) and, on CUDA, the allocator's own snapshot (pickle)."""
    out_dir = getattr(getattr(obs.session, "options", None), "out_dir", None)
    if out_dir is None:
        return {}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    live_path = out_dir / "memory-live.json"
    live_path.write_text(
        json.dumps({k: v for k, v in oom.items()}, indent=1, default=str) + "\n", encoding="utf-8"
    )
    written["live"] = str(live_path)
    if obs.cuda_history:
        import torch

        try:
            path = out_dir / "memory-snapshot.pickle"
            torch.cuda.memory._dump_snapshot(str(path))
            written["cuda_snapshot"] = str(path)
        except Exception as exc:
            written["cuda_snapshot_error"] = repr(exc)
    return written


def _capacity() -> int | None:
    """The device's memory when no limit was given (growth's "steps until it runs out")."""
    try:
        from torchscalpel.plan.devices import local_device

        return local_device().memory
    except Exception:
        return None

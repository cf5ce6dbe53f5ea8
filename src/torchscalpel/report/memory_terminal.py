"""The terminal summary of a memory section (plain text lines; the CLI prints them)."""

from __future__ import annotations

from typing import Any

from torchscalpel.runtime.memory_categories import CATEGORIES
from torchscalpel.units import fmt_bytes

LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations (saved for backward)",
    "temporaries": "temporaries",
}


def _short(site: str | None) -> str:
    """``/long/path/train.py:42`` -> ``train.py:42``."""
    if not site:
        return "?"
    head, _, line = site.rpartition(":")
    return f"{head.rsplit('/', 1)[-1]}:{line}" if head else site


def category_lines(by_category: dict[str, int], total: int) -> list[str]:
    """One line per category with its share of ``total``."""
    out = []
    for c in CATEGORIES:
        v = int(by_category.get(c, 0))
        share = v / total if total else 0.0
        out.append(f"  {LABELS[c]:<34} {fmt_bytes(v):>11}  {share:6.1%}")
    return out


def capacity_words(section: dict[str, Any]) -> str:
    """What the run's headroom is measured against: the --memory-limit, the GPU, or (a CPU run) host RAM."""
    if section.get("limit"):
        return "the --memory-limit"
    return "host RAM, a CPU run" if section.get("device") == "cpu" else "the device's memory"


def _count(value: Any) -> int | None:
    """``value`` as a byte or step count (an int >= 0, not a bool), else None: a record is data."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def verdict(section: dict[str, Any]) -> str | None:
    """One sentence answering "is memory a problem?" for a run that did not run out: growth with its rate, or
    stable with the peak and the headroom left; None for a run that ran out (its headline says so). A section
    whose analysis failed is not judged: growth was never computed, so "stable" would be a guess."""
    if section.get("error"):
        return f"verdict: not judged: {section['error']}; what was measured follows"
    if section.get("oom") or not isinstance(section.get("peak"), dict):
        return None
    peak = _count(_dict(section.get("peak")).get("total")) or 0
    capacity = _count(section.get("limit")) or _count(section.get("capacity"))
    room = ""
    if capacity:
        room = (
            f", headroom {fmt_bytes(max(0, capacity - peak))} of {fmt_bytes(capacity)} "
            f"({capacity_words(section)})"
        )
    growth = _dict(section.get("growth"))
    rate = _count(growth.get("per_step"))
    if rate:
        left = _count(growth.get("steps_left"))
        cap = _count(growth.get("capacity"))
        until = f", {left} more steps until {fmt_bytes(cap)}" if left is not None and cap else ""
        return f"verdict: memory grows {fmt_bytes(rate)} per step{until}: a leak to fix"
    if isinstance(growth.get("note"), str):
        return f"verdict: peak {fmt_bytes(peak)}{room}; growth not judged ({growth['note']})"
    steps = _count(growth.get("steps"))
    over = f" over {steps} step ends" if steps else ""
    return f"verdict: stable, no growth{over}; peak {fmt_bytes(peak)}{room}"


def next_line(section: dict[str, Any], script: str, run_dir: str) -> str:
    """What to run after this memory run: the patch for a run that ran out, the leak's lines for one that
    grows, tune for a stable one (``--fit SIZE`` where a smaller device must hold it)."""
    if section.get("oom"):
        return (
            f"next: scalpel fix {run_dir} --verify (the ladder's first rung that fits, as a patch of your "
            "script, or why it cannot be one)"
        )
    if _count(_dict(section.get("growth")).get("per_step")):
        return (
            "next: fix the growing line(s) above (keep loss.item(), not loss; del outputs kept from an earlier "
            f"step), then scalpel memory -- {script} again"
        )
    return (
        f"next: scalpel tune -- {script} (speed); scalpel tune --fit SIZE -- {script} keeps only what fits "
        "in SIZE"
    )


def summary_lines(section: dict[str, Any]) -> list[str]:
    """The whole summary: the verdict, peak breakdown, owners, sites, growth, post-mortem and ladder."""
    if "error" in section and "peak" not in section:
        return [f"memory analysis failed: {section['error']}"]
    lines: list[str] = []
    said = verdict(section)
    if said:
        lines.append(said)
    peak = section.get("peak", {})
    total = int(peak.get("breakdown_total") or peak.get("total") or 0)
    lines.append(
        f"peak live tensors {fmt_bytes(peak.get('total'))} (step {peak.get('step')}, {peak.get('phase')}, "
        f"at {peak.get('op')} in {peak.get('module') or 'no module'})"
    )
    lines += category_lines(peak.get("by_category", {}), total)
    if section.get("compiled"):
        lines.append(f"note: {section['compiled']}")
    evaluation = section.get("evaluation") or {}
    if evaluation.get("note") and not section.get("oom"):
        lines.append(str(evaluation["note"]))
    before = section.get("before_training")
    if before:
        lines.append(
            f"before training the live total was higher: {fmt_bytes(before['total'])} at "
            f"{_short(str(before.get('site')))} ({before.get('op')}; loading data or building the model)"
        )
    owners = peak.get("blocks") if len(peak.get("blocks") or []) < len(peak.get("modules") or []) else None
    if owners or peak.get("modules"):
        lines.append("activations by module at the peak:")
        lines += [
            f"  {m['name'] or '(outside any module)':<34} {fmt_bytes(m['bytes']):>11}"
            for m in (owners or peak["modules"])[:6]
        ]
    if peak.get("sites"):
        lines.append("largest live allocations at the peak, by call site:")
        lines += [f"  {_short(s['name']):<34} {fmt_bytes(s['bytes']):>11}" for s in peak["sites"][:6]]
    cuda = section.get("cuda")
    if cuda:
        lines.append(
            f"allocator cache: {fmt_bytes(cuda['reserved'])} reserved, {fmt_bytes(cuda['reserved_free'])} "
            f"free in it ({cuda['share']:.0%}), largest free block {fmt_bytes(cuda['largest_free'])}"
        )
    growth = section.get("growth") or {}
    stopped = growth.get("stopped")
    if stopped and not growth.get("per_step"):
        lines.append(
            f"memory grew {fmt_bytes(stopped['grew'])} over the first steps, then stayed at "
            f"{fmt_bytes(stopped['live'])} for the last {stopped['flat_steps']} step ends: bounded state (an "
            "optimizer's history, a cache that filled), not growth"
        )
    bounded = growth.get("bounded")
    if bounded:
        lines.append(
            f"optimizer state grew {fmt_bytes(bounded['grew_per_step'])} per step while {bounded['optimizer']}'s "
            f"history filled ({bounded['pairs']} of {bounded['history_size']} pairs): bounded at "
            f"{fmt_bytes(bounded['cap'])}, {fmt_bytes(bounded['left'])} more; not growth"
        )
    if growth.get("per_step"):
        left = growth.get("steps_left")
        lines.append(
            f"memory grows {fmt_bytes(growth['per_step'])} per step"
            + (f": {left} more steps until {fmt_bytes(growth.get('capacity'))}" if left is not None else "")
        )
        kept = growth.get("kept")
        if kept:
            lines.append(
                f"  {fmt_bytes(kept['activations'])} of activations from earlier steps are still live "
                f"(a tensor that requires grad is kept across steps, with its graph)"
            )
        lines += [
            f"  {_short(r['site']):<34} +{fmt_bytes(r['per_step'])}/step" for r in growth.get("sites", [])[:5]
        ]
    oom = section.get("oom")
    cause = (section.get("top_cause") or {}).get("text", "?")
    if oom:
        req = oom["request"]
        what = req.get("device_error") or f"limit {fmt_bytes(oom.get('limit'))}"
        lines.append(
            f"OUT OF MEMORY ({what}): {req.get('op')} at {_short(req.get('site'))} asked for "
            f"{fmt_bytes(req.get('bytes'))} with {fmt_bytes(oom.get('live'))} live (step {req.get('step')}, "
            f"{req.get('phase')}, in {req.get('module') or 'no module'})"
        )
        note = (section.get("top_cause") or {}).get("note")
        lines.append(f"top cause: {cause}" + (f" ({note})" if note else ""))
        lines += category_lines(oom.get("by_category", {}), int(oom.get("live") or 0))
        if oom.get("kept_activations") and not growth.get(
            "per_step"
        ):  # growth named before a slope could be fit
            lines.append(
                f"  {fmt_bytes(oom['kept_activations'])} of activations saved in earlier steps were still live "
                "(a tensor that requires grad is kept across steps, with its graph)"
            )
        if oom.get("plan_error"):
            lines.append(f"  (no plan numbers: {oom['plan_error']})")
        if oom.get("ladder"):
            lines.append("fix ladder:")
            for r in oom["ladder"]:
                saves = f"saves {fmt_bytes(r['saves'])}" if r.get("saves") else ""
                if r.get("peak"):
                    saves = ", ".join(x for x in (saves, f"plan peak {fmt_bytes(r['peak'])}") if x)
                fits = {True: "fits", False: "does not fit alone", None: ""}[r.get("fits")]
                cfg = (
                    " [scalpel run: " + ", ".join(f"{k}={v}" for k, v in r["config"].items()) + "]"
                    if r.get("config")
                    else ""
                )
                tail = "; ".join(x for x in (saves, fits, r.get("why", "")) if x)
                lines.append(f"  - {r['action']}" + (f" ({tail})" if tail else "") + cfg)
        if evaluation.get("note"):
            lines.append(str(evaluation["note"]))
    else:
        # "largest share" names the largest of the categories printed above; the top cause, when it is another
        # (temporaries of a training backward read as activations, growth, data preparation), follows with its why
        by_category = peak.get("by_category", {})
        largest = max(CATEGORIES, key=lambda c: int(by_category.get(c, 0)))
        share = int(by_category.get(largest, 0)) / total if total else 0.0
        lines.append(f"largest share: {LABELS[largest]} ({share:.1%})")
        top = section.get("top_cause") or {}
        if top.get("key") and top["key"] != largest:
            lines.append(f"top cause: {cause}" + (f" ({top['note']})" if top.get("note") else ""))
    return lines

"""The terminal summary of a memory section (plain text lines; the CLI prints them), read from its view
(:class:`~torchscalpel.sections.MemorySection`)."""

from __future__ import annotations

from typing import Any

from torchscalpel.runtime.memory_categories import CATEGORIES
from torchscalpel.sections import MemorySection
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


def render(section: MemorySection) -> list[str]:
    """The whole summary: the verdict (:attr:`MemorySection.verdict`, the page's too), peak breakdown, owners,
    sites, growth, post-mortem and ladder. Formatting only: what is judged is judged by the view."""
    if section.error and section.peak is None:
        return [f"memory analysis failed: {section.error}"]
    lines: list[str] = []
    if section.verdict:
        lines.append(section.verdict)
    peak = section.peak or {}
    total = int(peak.get("breakdown_total") or peak.get("total") or 0)
    lines.append(
        f"peak live tensors {fmt_bytes(peak.get('total'))} (step {peak.get('step')}, {peak.get('phase')}, "
        f"at {peak.get('op')} in {peak.get('module') or 'no module'})"
    )
    lines += category_lines(peak.get("by_category", {}), total)
    if section.compiled:
        lines.append(f"note: {section.compiled}")
    note = (section.evaluation or {}).get("note")
    if note and not section.oom:
        lines.append(str(note))
    before = section.before_training
    if before:
        lines.append(
            f"before training the live total was higher: {fmt_bytes(before['total'])} at "
            f"{_short(str(before.get('site')))} ({before.get('op')}; loading data or building the model)"
        )
    lines += _owner_lines(peak)
    cuda = section.cuda
    if cuda:
        lines.append(
            f"allocator cache: {fmt_bytes(cuda['reserved'])} reserved, {fmt_bytes(cuda['reserved_free'])} "
            f"free in it ({cuda['share']:.0%}), largest free block {fmt_bytes(cuda['largest_free'])}"
        )
    lines += _growth_lines(section)
    if section.oom:
        lines += _oom_lines(section)
        if note:
            lines.append(str(note))
    else:
        lines += _share_lines(section, total)
    return lines


def _owner_lines(peak: dict[str, Any]) -> list[str]:
    """Who held the activations at the peak (blocks when they say it in fewer rows), and the largest sites."""
    lines: list[str] = []
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
    return lines


def _growth_lines(section: MemorySection) -> list[str]:
    """Bounded state told apart from growth, then the growth and the lines it comes from."""
    lines: list[str] = []
    growth = section.growth or {}
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
            + (
                (
                    f": {left} more steps until {fmt_bytes(growth.get('capacity'))}"
                    if left
                    else f": it reached {fmt_bytes(growth.get('capacity'))} in this run"
                )
                if left is not None
                else ""
            )
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
    return lines


def _oom_lines(section: MemorySection) -> list[str]:
    """The out-of-memory post-mortem: the request that failed, its cause, what was live, the fix ladder."""
    oom = section.oom or {}
    top = section.top_cause or {}
    req = oom["request"]
    what = req.get("device_error") or f"limit {fmt_bytes(oom.get('limit'))}"
    lines = [
        f"OUT OF MEMORY ({what}): {req.get('op')} at {_short(req.get('site'))} asked for "
        f"{fmt_bytes(req.get('bytes'))} with {fmt_bytes(oom.get('live'))} live (step {req.get('step')}, "
        f"{req.get('phase')}, in {req.get('module') or 'no module'})",
        f"top cause: {top.get('text', '?')}" + (f" ({top['note']})" if top.get("note") else ""),
    ]
    lines += category_lines(oom.get("by_category", {}), int(oom.get("live") or 0))
    if oom.get("kept_activations") and not (section.growth or {}).get("per_step"):
        # growth named before a slope could be fit
        lines.append(
            f"  {fmt_bytes(oom['kept_activations'])} of activations saved in earlier steps were still live "
            "(a tensor that requires grad is kept across steps, with its graph)"
        )
    if oom.get("plan_error"):
        lines.append(f"  (no plan numbers: {oom['plan_error']})")
    if oom.get("ladder"):
        lines.append("fix ladder:")
        lines += [_rung_line(r) for r in oom["ladder"]]
    return lines


def _rung_line(r: dict[str, Any]) -> str:
    """One rung of the ladder: the action, what it saves, whether it fits, its scalpel.toml settings."""
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
    return f"  - {r['action']}" + (f" ({tail})" if tail else "") + cfg


def _share_lines(section: MemorySection, total: int) -> list[str]:
    """ "largest share" names the largest of the categories printed above; the top cause, when it is another
    (temporaries of a training backward read as activations, growth, data preparation), follows with its why."""
    by_category = (section.peak or {}).get("by_category", {})
    largest = max(CATEGORIES, key=lambda c: int(by_category.get(c, 0)))
    share = int(by_category.get(largest, 0)) / total if total else 0.0
    lines = [f"largest share: {LABELS[largest]} ({share:.1%})"]
    top = section.top_cause or {}
    if top.get("key") and top["key"] != largest:
        lines.append(f"top cause: {top.get('text', '?')}" + (f" ({top['note']})" if top.get("note") else ""))
    return lines

"""From a ``scalpel memory`` record to the edits ``scalpel fix`` proposes: the ladder's first rung that
fits under the limit and is a change of the code, placed at the lines the run recorded.

The ladder (:mod:`torchscalpel.memory.ladder`) orders its rungs, those that fit first. fix takes them in
that order and keeps the first one it can place (:func:`first_placed`, on the file's text): one change,
the one ``--verify`` re-measures. A fitting rung fix cannot place (a plain training loop's batch split,
a block called inside a library, a line that does not hold what the run saw) is listed as ``not
patched`` with its snippet, and the next fitting rung is tried. The rungs:

- ``checkpoint-blocks``: the recorded call of the repeated block wrapped in
  ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``; HF ``gradient_checkpointing=True``;
- ``micro-batches``: HF ``per_device_train_batch_size`` / ``gradient_accumulation_steps``, Lightning's
  DataLoader ``batch_size`` and ``Trainer(accumulate_grad_batches=...)``; a loop of the user's own is
  not rewritten (the loss scaling and the step every K batches are the loop's logic);
- ``bf16``: the autocast edit tune's amp setting makes (:func:`torchscalpel.fix.locate.amp_plan`);
- ``set-to-none``: ``zero_grad(set_to_none=True)`` after the recorded ``optimizer.step()``.

Nothing here reads the user's files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchscalpel.fix.cst import Edit
from torchscalpel.fix.edits import apply_edit
from torchscalpel.fix.locate import amp_plan
from torchscalpel.fix.planned import Planned, framework_of, hf_gradient_checkpointing, one_site, script_file
from torchscalpel.fix.record_values import sites as checked_sites
from torchscalpel.record import RunRecord
from torchscalpel.sections import MemorySection, SitesSection

CODE_RUNGS = ("checkpoint-blocks", "micro-batches", "bf16", "set-to-none")
"""The ladder's rungs that are a change of the script (the others: an environment variable, a smaller
batch that changes the training, a fix of growth at a site, another optimizer)."""


def memory_oom(record: RunRecord) -> dict[str, Any] | None:
    """The post-mortem of a memory run that crossed its limit (``sections["memory"]["oom"]``), else None."""
    section = record.section(MemorySection)
    oom = section.oom if section is not None else None
    return oom if isinstance(oom, dict) and oom.get("ladder") is not None else None


def has_memory(record: RunRecord) -> bool:
    """True for the record of a ``scalpel memory`` run (with or without an out-of-memory)."""
    return record.section(MemorySection) is not None


def memory_plan(record: RunRecord) -> list[Planned]:
    """Every fitting code rung of ``record``'s out-of-memory ladder, in the ladder's order, as an edit
    or as why it cannot be placed (empty when the run fit); :func:`first_placed` keeps the one to make."""
    oom = memory_oom(record)
    if oom is None:
        return []
    sites = checked_sites(record)
    framework = framework_of(sites)
    script = script_file(record)
    fitting = [r for r in oom.get("ladder") or [] if r.get("fits") and r.get("kind") in CODE_RUNGS]
    out = [
        dataclasses.replace(_rung_plan(rung, oom, sites, framework, script), rule=str(rung["kind"]))
        for rung in fitting
    ]
    if not fitting:
        first = next((r for r in oom.get("ladder") or [] if r.get("fits")), None)
        out.append(
            Planned(
                "memory: a change that fits",
                "memory",
                None,
                None,
                str(first["action"]) if first else "-",
                (
                    f"the ladder's rung that fits ({first['kind']}) is not a change fix makes in code"
                    if first
                    else "no rung of the ladder fits under the limit"
                ),
            )
        )
    return out


def first_placed(alternatives: list[Planned], read: Callable[[Path], str | None]) -> list[Planned]:
    """The alternatives up to the first whose edit applies (or is already done) on its file's current
    text; one the editor refuses there stays as ``not patched`` with the editor's reason, and the next
    is tried. ``read`` gives a file's text, or None when it may not be edited (that item is kept and
    says why when it is made)."""
    out: list[Planned] = []
    for p in alternatives:
        if p.edit is None or p.file is None:
            out.append(p)
            if p.done:
                break
            continue
        text = read(p.file)
        if text is not None:
            _, outcome = apply_edit(text, p.edit)
            if outcome.status == "refused":
                where = f"{p.file.name}:{p.edit.line}: " if p.edit.line else ""
                out.append(dataclasses.replace(p, file=None, edit=None, reason=where + outcome.reason))
                continue
        out.append(p)
        break
    return out


def _rung_plan(
    rung: dict[str, Any],
    oom: dict[str, Any],
    sites: SitesSection,
    framework: str | None,
    script: Path | None,
) -> Planned:
    kind = rung["kind"]
    if kind == "checkpoint-blocks":
        return _checkpoint_plan(sites, framework, script)
    if kind == "micro-batches":
        return _microbatch_plan(rung, oom, sites, framework, script)
    if kind == "bf16":
        return dataclasses.replace(
            amp_plan("bf16", sites, framework, script), label="bf16 autocast", source="memory"
        )
    return _set_to_none_plan(sites)


def _checkpoint_plan(sites: SitesSection, framework: str | None, script: Path | None) -> Planned:
    site = sites.block or {}
    cls = str(site.get("class") or "block")
    label = f"activation checkpointing of the {cls} blocks"
    snippet = f"x = torch.utils.checkpoint.checkpoint({cls.lower()}, x, use_reentrant=False)  # where the {cls} is called"
    if framework == "transformers":
        return hf_gradient_checkpointing(label, "memory", script)
    if not site.get("file") or not site.get("line"):
        return Planned.refused(
            label, "memory", snippet, "the run recorded no training call of a repeated block"
        )
    if site.get("library"):
        where = (
            "torch code (an nn.Sequential, or a torch.utils.checkpoint already there)"
            if site["library"] == "torch"
            else site["library"]
        )
        return Planned.refused(
            label,
            "memory",
            snippet,
            f"the {cls} blocks are called by {where}, not at a line of yours",
        )
    return Planned(
        label,
        "memory",
        Path(site["file"]),
        Edit(kind="checkpoint_call", line=int(site["line"]), callee=cls),
        snippet,
    )


def _microbatch_plan(
    rung: dict[str, Any], oom: dict[str, Any], sites: SitesSection, framework: str | None, script: Path | None
) -> Planned:
    batch = int((oom.get("plan") or {}).get("batch") or 0)
    k = int((rung.get("config") or {}).get("microbatches") or 0)
    label = f"{k} micro-batches of {batch // k if k else '?'} with gradient accumulation (global batch {batch} kept)"
    snippet = (
        f"loader = DataLoader(..., batch_size={batch // k if k else '?'})\n"
        f"for i, (x, y) in enumerate(loader):\n"
        f"    loss = loss_fn(model(x), y) / {k}\n"
        f"    loss.backward()\n"
        f"    if (i + 1) % {k} == 0:\n"
        f"        optimizer.step()\n"
        f"        optimizer.zero_grad(set_to_none=True)"
    )
    if not batch or k < 2:
        return Planned.refused(
            label, "memory", snippet, "the record holds no batch size or micro-batch count"
        )
    params = (("batch", batch), ("k", k))
    if framework == "transformers":
        return Planned(
            label,
            "memory",
            script,
            Edit(kind="batch_accum", callee="TrainingArguments", kwargs=params),
            f"TrainingArguments(..., per_device_train_batch_size={batch // k}, gradient_accumulation_steps={k})",
        )
    if framework == "lightning":
        site, why = one_site(sites.dataloaders, "DataLoader")
        lightning = f"DataLoader(..., batch_size={batch // k}) and Trainer(..., accumulate_grad_batches={k})"
        if site is None:
            return Planned(label, "memory", None, None, lightning, why)
        return Planned(
            label,
            "memory",
            Path(site["file"]),
            Edit(kind="batch_accum", line=int(site["line"]), callee="DataLoader", kwargs=params),
            lightning,
        )
    return Planned.refused(
        label,
        "memory",
        snippet,
        "in your own training loop, the split is the loop's logic (the loss divided by K, a step every K "
        "batches, the schedule counted in steps); fix does not rewrite loops",
    )


def _set_to_none_plan(sites: SitesSection) -> Planned:
    label = "zero_grad(set_to_none=True) after optimizer.step()"
    snippet = "optimizer.step()\noptimizer.zero_grad(set_to_none=True)"
    site = sites.step or {}
    if not site.get("file") or not site.get("line"):
        return Planned.refused(label, "memory", snippet, "the run recorded no optimizer.step() call")
    if site.get("library"):
        return Planned.refused(label, "memory", snippet, f"the optimizer steps inside {site['library']}")
    return Planned(
        label,
        "memory",
        Path(site["file"]),
        Edit(kind="zero_grad_after_step", line=int(site["line"])),
        snippet,
    )


def header_lines(record: RunRecord, patched: set[str]) -> list[str]:
    """What the memory run measured and the plan's peak for each ``patched`` rung kind, for the patch's
    comment block (empty for a run that fit)."""
    from torchscalpel.units import fmt_bytes

    oom = memory_oom(record)
    if oom is None:
        return []
    request = oom.get("request") or {}
    section = record.section(MemorySection)
    cause = ((section.top_cause if section is not None else None) or {}).get("key")
    asked = f" when it asked for {fmt_bytes(int(request['bytes']))} more" if request.get("bytes") else ""
    lines = [
        f"measured: the run crossed the limit of {fmt_bytes(int(oom.get('limit') or 0))} with "
        f"{fmt_bytes(int(oom.get('live') or 0))} live{asked}"
        + (
            f", in step {request.get('step')} ({request.get('phase')})"
            if request.get("step") is not None
            else ""
        )
        + (f"; cause: {cause}" if cause else "")
    ]
    for rung in oom.get("ladder") or []:
        if rung.get("kind") in patched:
            peak = rung.get("peak")
            lines.append(
                f"the ladder's rung: {rung['action']}: "
                + (
                    f"plan peak {fmt_bytes(int(peak))}"
                    if peak
                    else f"frees {fmt_bytes(int(rung['saves']))} of what was live at the crossing"
                    if rung.get("saves")
                    else "plan peak not measured: the plan does not simulate it"
                )
            )
    return lines

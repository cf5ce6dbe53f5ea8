"""From a doctor run's findings to the edits ``scalpel fix`` proposes: each finding whose fix is one
mechanical change becomes an :class:`~torchscalpel.fix.cst.Edit` anchored at the finding's recorded
``file:line`` (what the rule saw at run time, or the static rule's node), or a
:class:`~torchscalpel.fix.planned.Planned` that says why it is not patched. Nothing here reads the
user's files; the editors (:mod:`torchscalpel.fix.editors`, the doctor kinds in
:mod:`torchscalpel.fix.editors.doctor`) check that the code at the line is what the rule expects and
refuse otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchscalpel.fix.cst import Edit
from torchscalpel.fix.diff import printable
from torchscalpel.fix.planned import Planned, script_file
from torchscalpel.record import RunRecord
from torchscalpel.sections import SitesSection

DOCTOR_RULES = (
    "unsafe-torch-load",
    "whole-model-save",
    "grad-not-zeroed",
    "sampler-set-epoch-missing",
    "eval-without-no-grad",
    "eval-in-train-mode",
    "loss-graph-retained",
    "clip-before-unscale",
    "unseeded-run",
    "train-loader-not-shuffled",
    "module-in-plain-container",
    "tensor-attribute-not-registered",
    "super-init-missing",
    "empty-cache-in-loop",
    "cudnn-disabled",
)
"""Doctor findings whose fix is one mechanical edit anchored at the finding's line."""

SEED_CODE = "torch.manual_seed(0)\n"
"""What ``unseeded-run`` inserts after the imports: torch's generator seeds the weights' initialisation
and the DataLoader's shuffling, which is what the runtime rule looks for (any one seeding call)."""


def loaded_beyond_weights(finding: dict[str, Any]) -> str:
    """What the runtime saw a ``torch.load(weights_only=False)`` return that a weights-only load refuses
    (``the file held ...`` in the finding's evidence: modules, numpy arrays, other classes), "" when the file
    held only tensors and plain data, or when the finding is static (nothing was loaded to look at)."""
    for line in finding.get("evidence") or []:
        if not isinstance(line, str) or not line.startswith("the file held "):
            continue
        held = line[len("the file held ") :]
        what, _, refused = held.partition("; globals a weights-only load refuses: ")
        refused = refused.strip()
        if refused and refused != "none":
            return printable(refused if refused == what.strip() else f"{what} ({refused})")[:300]
        parts = [p.strip() for p in what.split(",")]
        beyond = [p for p in parts if p and p not in ("tensors", "plain Python data")]
        return printable(", ".join(beyond))[:300] if beyond else ""
    return ""


def _edit(rule: str, file: Path, line: int, finding: dict[str, Any], train_line: int) -> Edit:
    """The edit for ``rule`` at ``line`` (``rule`` is one of :data:`DOCTOR_RULES`)."""
    if rule == "unsafe-torch-load":  # with its writer when the file saves a whole module there
        # What the run saw the file hold travels with the edit: weights_only=True alone would refuse a
        # file of pickled objects (the script's own classes, numpy arrays) on the script's next start.
        held = loaded_beyond_weights(finding)
        return Edit(
            kind="safe_load",
            line=line,
            callee="load",
            kwargs=(("file", str(file)),) + ((("held", held),) if held else ()),
        )
    if rule == "whole-model-save":
        # The file travels with the edit: the other files of the tree around it that read the same
        # path are looked for from there (fix/editors/checkpoint.py).
        return Edit(kind="save_state_dict", line=line, callee="save", kwargs=(("file", str(file)),))
    if rule == "grad-not-zeroed":  # the finding points at the optimizer's step() call
        return Edit(
            kind="after_statement",
            line=line,
            callee=".step(",
            code="{opt}.zero_grad(set_to_none=True)\n",
            marker=".zero_grad(",
        )
    if rule == "sampler-set-epoch-missing":  # the loop over the loader (runtime) or the sampler (static)
        return Edit(kind="set_epoch", line=line)
    if rule == "eval-without-no-grad":
        # The rule counts the unused forwards by the model's mode: model.eval()/train() is added
        # only when the run saw them in training mode (no_grad alone would then raise
        # eval-in-train-mode in the verification's doctor re-run).
        train_mode = any("in train mode" in str(e) for e in finding.get("evidence") or [])
        return Edit(kind="no_grad", line=line, kwargs=(("train_line", train_line), ("eval_mode", train_mode)))
    if rule == "eval-in-train-mode":  # the forward under no_grad with dropout/batch-norm in training mode
        return Edit(kind="eval_mode", line=line)
    if rule == "loss-graph-retained":  # the finding points at the backward of the loss that is kept
        return Edit(kind="detach_kept", line=line)
    if rule == "clip-before-unscale":  # the clip_grad_*_ call
        return Edit(kind="unscale_before_clip", line=line)
    if rule == "train-loader-not-shuffled":  # the loop the run saw take the first training batch
        return Edit(kind="shuffle", line=line)
    if rule == "module-in-plain-container":  # the self.NAME = [...] assignment
        return Edit(kind="module_container", line=line)
    if rule == "tensor-attribute-not-registered":  # the self.NAME = <tensor> assignment
        return Edit(kind="register_buffer", line=line)
    if rule == "super-init-missing":  # the early assignment, or the __init__ line
        return Edit(kind="super_init_first", line=line)
    if rule == "empty-cache-in-loop":  # the call (static) or the line that called it every step
        return Edit(kind="delete_statement", line=line, callee="empty_cache")
    if rule == "cudnn-disabled":
        return Edit(kind="delete_statement", line=line, callee="cudnn.enabled")
    # unseeded-run: one seeding call after the imports of the script (the line only names the file)
    return Edit(kind="global_call", code=SEED_CODE)


def doctor_plan(record: RunRecord) -> list[Planned]:
    """The edits for doctor findings with a mechanical fix, at each finding's line."""
    sites = record.section(SitesSection) or SitesSection()
    forward = sites.forward or {}
    out: list[Planned] = []
    for finding in record.findings:
        rule = str(finding.get("rule", ""))
        if rule not in DOCTOR_RULES:
            continue
        where = finding.get("location") or {}
        snippet = str(finding.get("fix") or "")
        if not where.get("file") or not where.get("line"):
            out.append(Planned(rule, "doctor", None, None, snippet, "the finding names no line", rule=rule))
            continue
        file, line = Path(where["file"]), int(where["line"])
        # The training forward's line, where the run recorded it in this file: an evaluation edit
        # must never put it under no_grad.
        train_line = int(forward["line"]) if forward.get("line") and forward.get("file") == str(file) else 0
        edit = _edit(rule, file, line, finding, train_line)
        if rule == "unseeded-run":
            # The seed goes into the script the run started, not a module the first step ran in.
            file = script_file(record) or file
        out.append(Planned(rule, "doctor", file, edit, snippet, rule=rule))
    return out

"""What every planner of ``scalpel fix`` shares (:mod:`torchscalpel.fix.locate` and
:mod:`torchscalpel.fix.locate_knobs` for tune, :mod:`torchscalpel.fix.doctor_plan`,
:mod:`torchscalpel.fix.memory_plan`, :mod:`torchscalpel.fix.profile_plan`): :class:`Planned`, one
change placed as an :class:`~torchscalpel.fix.cst.Edit` or refused with why, and the readings of the
run's recorded sites (``sections["sites"]``) a plan is anchored at: the one site to edit, the
framework driving the step, the script the run ran. Nothing here reads the user's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchscalpel.fix.cst import Edit
from torchscalpel.record import RunRecord
from torchscalpel.sections import SitesSection


@dataclass(frozen=True, slots=True)
class Planned:
    """One change fix would make: an edit of ``file``, or (``edit`` None) why it cannot be placed."""

    label: str
    """What changes, for people: ``optimizer fused=True``, ``unsafe-torch-load``."""
    source: str
    """``tune`` or ``doctor``: which run asked for it."""
    file: Path | None
    edit: Edit | None
    snippet: str
    """The change as code, to apply by hand when it is not patched."""
    reason: str = ""
    """Why it is not patched (empty when ``edit`` is set)."""
    rule: str = ""
    """The doctor rule slug (doctor edits)."""
    done: bool = False
    """The run shows the script already does it (bf16 autocast active at the training forward)."""

    @classmethod
    def refused(cls, label: str, source: str, snippet: str, reason: str) -> Planned:
        """A change fix does not place: ``reason`` says why, ``snippet`` is the code to apply by hand."""
        return cls(label, source, None, None, snippet, reason)


def kwargs_at_site(
    label: str,
    source: str,
    site: dict[str, Any],
    callee: str,
    kwargs: tuple[tuple[str, Any], ...],
    snippet: str,
) -> Planned:
    """``kwargs`` set on the call at the recorded ``site`` (the class it recorded, else ``callee``)."""
    return Planned(
        label,
        source,
        Path(site["file"]),
        Edit(
            kind="call_kwargs", line=int(site["line"]), callee=str(site.get("class") or callee), kwargs=kwargs
        ),
        snippet,
    )


def hf_gradient_checkpointing(label: str, source: str, script: Path | None) -> Planned:
    """Activation checkpointing through HF's own switch, on the script's ``TrainingArguments(...)``."""
    return Planned(
        label,
        source,
        script,
        Edit(kind="call_anywhere", callee="TrainingArguments", kwargs=(("gradient_checkpointing", True),)),
        "TrainingArguments(..., gradient_checkpointing=True)",
    )


def model_site_refusal(model: dict[str, Any]) -> str:
    """Why the recorded line that builds the training model cannot be edited ("" when it can)."""
    if not model:
        return "the run recorded no training model being built"
    if model.get("library"):
        return f"the model is built inside {model['library']}"
    return ""


def framework_of(sites: SitesSection) -> str | None:
    """``transformers``, ``lightning`` or ``accelerate`` when the run shows that framework driving the
    training step (accelerate: the script built an ``Accelerator``, or its backward / step ran there)."""
    libraries = {
        s.get("library")
        for s in [*sites.optimizers, sites.forward or {}, sites.backward or {}, sites.step or {}]
        if isinstance(s, dict) and s.get("library")
    }
    if "transformers" in libraries:
        return "transformers"
    if libraries & {"lightning", "pytorch_lightning"}:
        return "lightning"
    if sites.accelerator or "accelerate" in libraries:
        return "accelerate"
    return None


def used_sites(sites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sites the run used (an optimizer that stepped, a loader iterated); all of them when none was."""
    used = [s for s in sites if s.get("used")]
    return used or sites


def one_site(sites: list[dict[str, Any]], what: str) -> tuple[dict[str, Any] | None, str]:
    """The one site to edit, or why there is none (none recorded, several, built in a library)."""
    used = used_sites(sites)
    places = {(s.get("file"), s.get("line")) for s in used}
    if not used:
        return None, f"the run recorded no {what} being built"
    if len(places) > 1:
        return (
            None,
            f"the run built {len(places)} {what}s at different lines; which one to change is a choice",
        )
    site = used[0]
    if site.get("library"):
        return None, f"the {what} is built inside {site['library']}, not in your code"
    return site, ""


def script_of(record: RunRecord, sites: SitesSection) -> Path | None:
    """The script the run ran, as an absolute path: a recorded site (of ``sites``) in a file of the
    script's name."""
    name = (((record.provenance or {}).get("code") or {}).get("script") or {}).get("path")
    target = (record.target or {}).get("script")
    candidates = [
        s.get("file")
        for s in [
            *sites.optimizers,
            *sites.dataloaders,
            sites.model or {},
            sites.forward or {},
            sites.backward or {},
        ]
        if isinstance(s, dict)
    ]
    candidates += [(f.get("location") or {}).get("file") for f in record.findings]
    for c in candidates:
        if c and name and Path(c).name == name:
            return Path(c)
    if target and Path(target).is_absolute():
        return Path(target)
    return None


def script_file(record: RunRecord) -> Path | None:
    """The absolute path of the script ``record`` ran, from its recorded sites (None when unknown)."""
    return script_of(record, record.section(SitesSection) or SitesSection())

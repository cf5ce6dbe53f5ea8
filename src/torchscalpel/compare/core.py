"""Line up two or more runs against the first: measured figures, recorded differences, a verdict."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchscalpel.compare.differences import Difference, all_differences
from torchscalpel.compare.facts import LossMatch, RunFacts, loss_match, run_facts
from torchscalpel.compare.verdict import step_change, verdict
from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.record import RECORD_FILENAME, SCHEMA_VERSION, RunRecord, load_record

COMPARE_VERSION = "1.0"


@dataclass(kw_only=True, slots=True)
class ComparedRun:
    """One run in the comparison: its label (A, B, ...), where it came from and its figures."""

    label: str
    path: str
    record: RunRecord
    facts: RunFacts

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (the record itself is not repeated, only its identity)."""
        r = self.record
        return {
            "label": self.label,
            "path": self.path,
            "name": r.name,
            "created": r.created,
            "schema_version": r.schema_version,
            "status": r.status,
            "facts": self.facts.to_dict(),
        }


@dataclass(kw_only=True, slots=True)
class Pair:
    """The baseline (A) against one other run."""

    a: ComparedRun
    b: ComparedRun
    ratio: float | None
    significant: bool
    threshold: float
    phase_delta_ms: dict[str, float]
    losses: LossMatch
    differences: list[Difference]
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return {
            "a": self.a.label,
            "b": self.b.label,
            "step_ratio": self.ratio,
            "significant": self.significant,
            "threshold": self.threshold,
            "phase_delta_ms": self.phase_delta_ms,
            "losses": self.losses.to_dict(),
            "differences": [d.to_dict() for d in self.differences],
            "verdict": self.verdict,
        }


@dataclass(kw_only=True, slots=True)
class Comparison:
    """Every run, every pair against the first, and what the reader should know (``notes``)."""

    runs: list[ComparedRun]
    pairs: list[Pair]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {
            "compare_version": COMPARE_VERSION,
            "runs": [r.to_dict() for r in self.runs],
            "pairs": [p.to_dict() for p in self.pairs],
            "notes": list(self.notes),
        }


def _label(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"R{i + 1}"


def _older_note(label: str, record: RunRecord) -> str | None:
    """A note for a record written under an older minor schema (it may lack what newer ones hold)."""
    try:
        major, minor = (int(x) for x in record.schema_version.split(".")[:2])
        cur_major, cur_minor = (int(x) for x in SCHEMA_VERSION.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) >= (cur_major, cur_minor):
        return None
    missing = (
        " it has no provenance, so code, data and seed differences are not compared;"
        if not record.provenance
        else ""
    )
    return (
        f"{label} is a schema {record.schema_version} record (this torchscalpel writes {SCHEMA_VERSION}):"
        f"{missing} figures it lacks are left blank."
    )


def compare_records(records: Sequence[RunRecord], paths: Sequence[str] | None = None) -> Comparison:
    """Compare ``records[1:]`` each against ``records[0]``."""
    if len(records) < 2:
        raise UsageError("Name at least two runs to compare, e.g. 'scalpel compare RUN_A RUN_B'.")
    runs = [
        ComparedRun(label=_label(i), path=(paths[i] if paths else r.name), record=r, facts=run_facts(r))
        for i, r in enumerate(records)
    ]
    notes = [n for n in (_older_note(r.label, r.record) for r in runs) if n]
    for r in runs:
        if not r.facts.median_step_ms:
            notes.append(f"{r.label} ({r.path}) measured no steps: its step time and phases are blank.")
    base = runs[0]
    pairs = []
    for other in runs[1:]:
        ratio, significant, threshold = step_change(base.facts, other.facts)
        # medians, as the step table shows: a delta the reader can check against the two cells above it
        deltas = {
            p: other.facts.phase_median_ms.get(p, 0.0) - v for p, v in base.facts.phase_median_ms.items()
        }
        match = loss_match(base.facts.losses, other.facts.losses)
        diffs = all_differences(base.record, other.record)
        pairs.append(
            Pair(
                a=base,
                b=other,
                ratio=ratio,
                significant=significant,
                threshold=threshold,
                phase_delta_ms=deltas,
                losses=match,
                differences=diffs,
                verdict=verdict(other.label, base.facts, other.facts, match, diffs, base_label=base.label),
            )
        )
    return Comparison(runs=runs, pairs=pairs, notes=notes)


def resolve_run(path: str | os.PathLike[str]) -> Path:
    """A run folder or its run.json; one sentence naming what is wrong otherwise."""
    p = Path(path)
    if p.is_dir():
        if not (p / RECORD_FILENAME).is_file() and (p / "rank-0" / RECORD_FILENAME).is_file():
            raise UsageError(f"{p} is a launch folder; compare one rank's run, e.g. {p / 'rank-0'}.")
        if not (p / RECORD_FILENAME).is_file():
            raise UsageError(
                f"{p} holds no {RECORD_FILENAME}; name a torchscalpel run folder or its run.json."
            )
        return p / RECORD_FILENAME
    if not p.exists():
        raise UsageError(f"{p} does not exist; name a torchscalpel run folder or its run.json.")
    return p


def compare_runs(paths: Sequence[str | os.PathLike[str]]) -> Comparison:
    """Load each run (folder or run.json; a newer major schema is refused) and compare them."""
    resolved = [resolve_run(p) for p in paths]
    records = []
    for p in resolved:
        try:
            records.append(load_record(p))
        except UsageError:
            raise
        except ScalpelError as exc:  # not JSON, not an object: a wrong path given, a usage error as in report
            message = str(exc)
            if str(p) not in message:
                message = f"{p}: {message[:1].lower()}{message[1:]}"
            raise UsageError(message) from None
    return compare_records(records, [str(p) for p in paths])

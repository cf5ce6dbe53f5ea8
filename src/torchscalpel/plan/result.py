"""What a plan returns (:class:`PlanResult`, one :class:`Row` per strategy): torch-free, so the package root
can export the type (``torchscalpel.PlanResult``) without importing torch; :mod:`torchscalpel.plan.planner`
computes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchscalpel.plan.planner import PlanRequest
    from torchscalpel.plan.simulate import Measurement
    from torchscalpel.plan.strategies import Breakdown

PLAN_VERSION = "1.0"
"""The version of ``sections["plan"]``'s layout."""


@dataclass(kw_only=True, slots=True)
class Row:
    """One table row: a strategy's breakdown and its largest fitting batch."""

    breakdown: Breakdown
    max_batch: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {**self.breakdown.to_dict(), "max_batch": self.max_batch}


@dataclass(kw_only=True, slots=True)
class PlanResult:
    """The plan for one model/batch/device."""

    request: PlanRequest
    measurement: Measurement
    rows: list[Row]
    alternatives: list[Row] = field(default_factory=list)
    """Rows with activation checkpointing flipped, computed when nothing fits without it."""
    recommendation: str = ""
    recommended: str | None = None
    other_checkpointing_act_peak: int | None = None
    """Activation peak with block checkpointing flipped (on when the rows have it off, and vice versa)."""

    @property
    def all_rows(self) -> list[Row]:
        """Rows then alternatives."""
        return [*self.rows, *self.alternatives]

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``record.sections["plan"]``)."""
        r = self.request
        return {
            "version": PLAN_VERSION,
            "model": r.model_name,
            "batch": r.batch.text(),
            "batch_size": r.batch.batch_size,
            "batch_dims": r.batch_note or r.batch.batch_dims(),
            "optimizer": r.settings.optimizer.label,
            "precision": str(r.settings.precision),
            "grad_accum": r.settings.grad_accum,
            "world_size": r.world_size,
            "nodes": r.nodes,
            "checkpointing": r.checkpointing,
            "device": r.device.to_dict(),
            "measurement": self.measurement.to_dict(),
            "rows": [row.to_dict() for row in self.rows],
            "alternatives": [row.to_dict() for row in self.alternatives],
            "recommended": self.recommended,
            "recommendation": self.recommendation,
            "act_peak_other_checkpointing": self.other_checkpointing_act_peak,
            **({"fsdp": r.fsdp} if r.fsdp else {}),
        }

"""Memory planning on fake tensors: per-rank memory for each parallel strategy, fits and max batch.

Public API: :func:`make_plan` / :class:`PlanRequest` (what ``scalpel plan`` runs) and
:func:`check_fits` (for ``scalpel launch --plan``: does this model/batch fit, in one sentence).
"""

from __future__ import annotations

from torchscalpel.plan.planner import PlanRequest, PlanResult, check_fits, make_plan

__all__ = ["PlanRequest", "PlanResult", "check_fits", "make_plan"]

"""Memory planning on fake tensors: per-rank memory for each parallel strategy, fits and max batch.

Public API: :func:`make_plan` / :class:`PlanRequest` (what ``scalpel plan`` runs) and
:func:`check_fits` (for ``scalpel launch --plan``: does this model/batch fit, in one sentence).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PlanRequest", "PlanResult", "check_fits", "make_plan"]


def __getattr__(name: str) -> Any:
    # Lazy: importing a torch-free submodule (plan.names, for the CLI parser) must not import torch.
    if name in __all__:
        from torchscalpel.plan import planner

        return getattr(planner, name)
    raise AttributeError(f"module 'torchscalpel.plan' has no attribute {name!r}")

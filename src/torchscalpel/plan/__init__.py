"""Memory planning on fake tensors: per-rank memory for each parallel strategy, fits and max batch.

What a user asks is one :class:`~torchscalpel.plan.options.PlanOptions` (a script's model or a factory's), run by
:func:`torchscalpel.stages.plan.run`. Below it: :class:`PlanRequest` (the model builder, batch spec and settings the
stage resolved from the options and the script), :func:`make_plan` that simulates it, and :func:`check_fits` (does
this model/batch fit, in one sentence).
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

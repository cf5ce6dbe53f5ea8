"""Tune's run window, torch-free so the CLI's help can quote it before torch loads."""

from __future__ import annotations

TUNE_STEPS = 10
"""Measured steps per trial for ``--steps auto``."""

MIN_MEASURE_S = 2.0
"""Measured wall time per trial with ``--steps auto``: a 15 ms step is timed over ~130 steps, not 10."""

FIT_STEPS = 5
"""Measured steps of each ``--fit`` trial at most (each runs under the memory tracker)."""

TUNE_BUDGET_S = 600.0
"""The whole search's wall-clock budget (``--budget 10m``)."""

TUNE_WARMUP = 3
"""Steps excluded from each trial's timing (compilation happens here)."""

CONFIRM_PAIRS = 3
"""Interleaved baseline/winner pairs of the final check (``--confirm``)."""

BATCH_STEPS = 5
"""``scalpel batch``: measured steps per size."""

BATCH_WARMUP = 2
"""``scalpel batch``: steps run before measuring, per size."""

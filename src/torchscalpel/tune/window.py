"""Tune's run window, torch-free so the CLI's help can quote it before torch loads."""

from __future__ import annotations

TUNE_STEPS = 10
"""Measured steps per trial for ``--steps auto``."""

MIN_MEASURE_S = 2.0
"""Measured wall time per trial with ``--steps auto``: a 15 ms step is timed over ~130 steps, not 10."""

FIT_STEPS = 5
"""Measured steps of each ``--fit`` trial at most (each runs under the memory tracker)."""

"""Memory that grows from step to step: which call site, how fast, and when it runs out.

Reads the step-end samples of the memory observer. A step end is where a training loop's live memory
returns to its floor (parameters, gradients or not, optimizer state); what is still live there and
more so at every step end is a leak in the making: tensors appended to a list, losses logged with
their graph (their saved activations stay alive), caches that never evict. The growth per step is
the least-squares slope over the steps measured after warm-up (the first step allocates optimizer
state and is never counted as growth).
"""

from __future__ import annotations

import itertools
from typing import Any

MIN_STEPS = 3
"""Step ends needed before a slope means anything."""

MIN_GROWTH = 4096
"""Bytes per step below which growth is noise (a Python int cache, a logged float)."""

STEADY_SHARE = 0.6
"""A site grows when its live bytes rose at this share of consecutive step ends or more."""


def slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    den = sum((i - mean_x) ** 2 for i in range(n))
    return num / den if den else 0.0


def _rising(values: list[int]) -> bool:
    ups = sum(1 for a, b in itertools.pairwise(values) if b > a)
    return ups >= STEADY_SHARE * (len(values) - 1)


def find_growth(samples: list[dict[str, Any]], *, capacity: int | None) -> dict[str, Any]:
    """Growing sites, total growth per step and steps until ``capacity`` (bytes) at that rate."""
    usable = [s for s in samples if not s.get("warmup")] or samples
    usable = usable[1:] if len(usable) > MIN_STEPS else usable  # the first step builds optimizer state
    if len(usable) > MIN_STEPS and not usable[-1].get("sites") and any(s.get("sites") for s in usable[:-1]):
        usable = usable[:-1]  # a run stopped mid-step (a limit crossed) ends on a partial sample
    out: dict[str, Any] = {"steps": len(usable), "sites": [], "per_step": 0, "steps_left": None, "kept": None}
    if len(usable) < MIN_STEPS:
        out["note"] = f"{len(usable)} step end(s) measured; growth needs {MIN_STEPS} or more"
        return out
    lives = [int(s["live"]) for s in usable]
    total_rate = slope([float(v) for v in lives])
    sites: set[str] = set()
    for s in usable:
        sites.update(s.get("sites", {}))
    rows: list[dict[str, Any]] = []
    for site in sites:
        values = [int(s.get("sites", {}).get(site, 0)) for s in usable]
        rate = slope([float(v) for v in values])
        if rate >= MIN_GROWTH and _rising(values):
            # the largest value, not the last: a run stopped mid-step (a limit crossed) ends on a partial sample
            rows.append({"site": site, "per_step": int(rate), "live": max(values)})
    rows.sort(key=lambda r: r["per_step"], reverse=True)
    out["sites"] = rows[:10]
    growing = total_rate >= MIN_GROWTH and _rising(lives)
    tail = lives[-max(MIN_STEPS, len(lives) // 3) :]
    if growing and max(tail) - min(tail) < MIN_GROWTH:
        # Growth that stopped is bounded state, not a leak: LBFGS's history fills to history_size pairs in its
        # first steps and stays there (time_sequence_prediction was told "grows 7.0 MiB/step: 3410 more steps
        # until 23.54 GiB" while its peak was flat); a cache that filled does the same.
        out["stopped"] = {"grew": max(lives) - lives[0], "flat_steps": len(tail), "live": max(tail)}
        growing = False
        out["sites"] = []
    out["per_step"] = int(total_rate) if growing else 0
    kept = [int(s.get("kept_activations", 0)) for s in usable]
    losses = [int(s.get("losses_kept", 0)) for s in usable]
    if growing and _rising(kept) and max(kept) > 0:
        out["kept"] = {
            "activations": max(kept),
            "per_step": int(slope([float(v) for v in kept])),
            "losses_kept": losses[-1],
        }
    if growing and capacity:
        peak = max(int(s.get("peak", s["live"])) for s in usable)
        out["steps_left"] = max(0, int((capacity - peak) / total_rate))
        out["capacity"] = capacity
    return out

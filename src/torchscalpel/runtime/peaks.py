"""Hardware peak FLOP/s, kept as data (``data/gpu_peaks.json``), and MFU from it."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def peak_table() -> dict[str, dict[str, float | None]]:
    """GPU name substring -> {dtype: dense peak TFLOP/s}."""
    text = resources.files("torchscalpel").joinpath("data/gpu_peaks.json").read_text(encoding="utf-8")
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def peak_tflops(gpu_name: str, dtype: str = "bf16") -> float | None:
    """Dense peak for ``gpu_name`` (longest matching key wins), or None when unknown."""
    name = gpu_name.lower()
    for key in sorted(peak_table(), key=len, reverse=True):
        if key.lower() in name:
            value = peak_table()[key].get(dtype)
            return float(value) if value is not None else None
    return None


def mfu(
    achieved_flops_per_s: float, environment: dict[str, Any], device: str | None
) -> dict[str, Any] | None:
    """Model FLOPs utilisation against the bf16 peak of the device the run timed, if known."""
    if not device or not device.startswith("cuda"):
        return None
    index = int(device.split(":")[1]) if ":" in device else 0
    gpus = environment.get("gpus") or []
    if index >= len(gpus):
        return None
    peak = peak_tflops(gpus[index]["name"], "bf16")
    if not peak:
        return None
    return {"gpu": gpus[index]["name"], "peak_tflops_bf16": peak, "mfu": achieved_flops_per_s / (peak * 1e12)}

"""The numbers both trackers log, read from the Run record: per-step series and run-level figures."""

from __future__ import annotations

import math
from typing import Any

from torchscalpel.record import PHASES, RunRecord
from torchscalpel.sections import EvalSection


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def step_scalars(record: RunRecord) -> list[tuple[int, dict[str, float]]]:
    """Per step index: ``step/time_ms``, ``step/<phase>_ms``, ``train/loss``, ``train/samples_per_s``,
    ``train/lr`` and ``train/grad_norm`` (where a stage recorded them), ``memory/*`` peaks; ``eval/loss`` at the
    step count each evaluation pass ran after (``sections["eval"]``)."""
    lr = _per_step(record, "lr")
    grad = _per_step(record, "grad_norm")
    summary = record.summary_view()
    # FLOPs are counted in the profiler window only; the same model runs every step, so each step's
    # FLOP/s is the window's FLOPs per step over that step's time (and MFU that over the device peak).
    flops = _number(summary.flops_per_step)
    peak = _number((summary.mfu or {}).get("peak_tflops_bf16"))
    out = []
    for s in record.steps:
        values: dict[str, float] = {"step/time_ms": s.total_ms}
        for phase, ms in s.phase_ms().items():
            values[f"step/{phase}_ms"] = ms
        loss = _number(s.loss)
        if loss is not None:
            values["train/loss"] = loss
        if s.samples and s.total_ms:
            values["train/samples_per_s"] = s.samples / (s.total_ms / 1000.0)
        if flops and s.training_ms:  # the step's time less its evaluation forwards, as the summary's FLOP/s
            values["perf/flops_per_s"] = flops / (s.training_ms / 1000.0)
            if peak:
                values["perf/mfu"] = values["perf/flops_per_s"] / (peak * 1e12)
        for key, series in (("train/lr", lr), ("train/grad_norm", grad)):
            v = _number(series.get(s.index))
            if v is not None:
                values[key] = v
        for key, v in (
            ("memory/cuda_allocated_peak_bytes", s.cuda_allocated_peak),
            ("memory/cuda_reserved_peak_bytes", s.cuda_reserved_peak),
            ("memory/rss_bytes", s.rss),
        ):
            if v:
                values[key] = float(v)
        out.append((s.index, values))
    return _with_eval(record, out)


def _with_eval(
    record: RunRecord, out: list[tuple[int, dict[str, float]]]
) -> list[tuple[int, dict[str, float]]]:
    """``out`` with ``eval/loss`` added at each evaluation pass's step (a pass after the last step adds an index)."""
    section = record.section(EvalSection)
    if section is None:
        return out
    by_index = {index: values for index, values in out}
    for p in section.passes:
        loss = _number(p.get("loss"))
        if loss is None:
            continue
        step = int(p["step"])
        if step not in by_index:
            by_index[step] = {}
            out.append((step, by_index[step]))
        by_index[step]["eval/loss"] = loss  # two passes at one step: the later one (TensorBoard keeps one)
    return sorted(out, key=lambda item: item[0])


def _per_step(record: RunRecord, key: str) -> dict[int, Any]:
    """A per-step series another stage stored as ``sections["steps_extra"][key]`` (index -> value) or
    as a list in ``record.extra["step_<key>"]``; {} when nobody recorded it."""
    extra = record.sections.get("steps_extra")
    if isinstance(extra, dict) and isinstance(extra.get(key), dict):
        return {int(k): v for k, v in extra[key].items()}
    series = record.extra.get(f"step_{key}")
    if isinstance(series, list):
        return dict(enumerate(series))
    return {}


def run_scalars(record: RunRecord) -> dict[str, float]:
    """Run-level figures: median step, phase means, samples/s, FLOP/s, MFU, memory peaks."""
    s = record.summary_view()
    out: dict[str, float] = {}
    for key, value in (
        ("summary/median_step_ms", s.median_step_ms),
        ("summary/samples_per_s", s.samples_per_s),
        ("summary/flops_per_s", s.achieved_flops_per_s),
        ("summary/rss_peak_bytes", s.rss_peak),
        ("summary/cuda_allocated_peak_bytes", s.cuda_allocated_peak),
    ):
        v = _number(value)
        if v is not None:
            out[key] = v
    for phase in PHASES:
        v = _number((s.phase_mean_ms or {}).get(phase))
        if v is not None:
            out[f"summary/{phase}_mean_ms"] = v
    if s.mfu:
        v = _number(s.mfu.get("mfu"))
        if v is not None:
            out["summary/mfu"] = v
    peak = _number((record.op_summary_view().memory or {}).get("peak_bytes"))
    if peak is not None:
        out["summary/allocator_peak_bytes"] = peak
    return out


def run_params(record: RunRecord) -> dict[str, str]:
    """What the run was asked to do: command, target, config keys, tune settings (flattened)."""
    params: dict[str, str] = {"command": " ".join(record.command), "status": record.status}
    if record.target.get("script"):
        params["script"] = str(record.target["script"])
    if record.target.get("module"):
        params["module"] = str(record.target["module"])
    params["script_args"] = " ".join(str(a) for a in record.target.get("args") or [])
    for key, value in record.config.items():
        if key == "tune_settings" and isinstance(value, dict):
            for k, v in _flatten(value).items():
                if v is not None:
                    params[f"tune.{k}"] = str(v)
        else:
            params[f"config.{key}"] = str(value)
    git = (record.provenance or {}).get("git") or {}
    for key in ("commit", "branch", "dirty"):
        if key in git:
            params[f"git.{key}"] = str(git[key])
    if record.environment.get("torch"):
        params["torch"] = str(record.environment["torch"])
    return params


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out

"""What limits the baseline's step, read from its Run record: the class that decides what tune tries.

The baseline's facts run records the per-step split (data wait / forward / backward / optimizer /
other) and profiles two measured steps. From those:

- **data**: the step waits on the DataLoader for a real share of its time;
- **optimizer**: ``optimizer.step`` is a real share of the step (many small parameter tensors);
- **launch** (CUDA): the GPU idles between kernels, most kernels are shorter than 10 µs and the
  host spends at least as long issuing ops as the GPU spends running them. On a CPU the analogue
  is *host overhead*: the time between ATen ops (Python, module calls, dispatch) is a real share
  of the step, which is what compile removes;
- **compute**: the GPU is busy (CUDA), or matmul / conv / attention ops hold most of the op time
  (CPU);
- **memory**: the CUDA peak is near the device's capacity.

:func:`classify` is pure (tests feed it synthetic records); :func:`classify_trial` reads a
trial's record and trace and never raises: a missing profile gives ``unknown`` with the reason.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchscalpel.record import RunRecord
    from torchscalpel.tune.runner import TrialResult

KINDS = ("launch", "compute", "data", "optimizer", "memory")
"""Bottleneck classes, each with the knobs that address it (:mod:`torchscalpel.tune.plan`)."""

DATA_SHARE = 0.10
"""Data-bound: DataLoader wait is at least this share of the step."""
OPTIMIZER_SHARE = 0.20
"""Optimizer-bound: ``optimizer.step`` is at least this share of the step."""
GPU_IDLE = 0.30
"""Launch-bound (CUDA): the GPU idles at least this share of the step..."""
SHORT_KERNELS = 0.50
"""...or at least this share of kernels is shorter than 10 µs while host op time >= GPU time."""
HOST_GAP = 0.25
"""Host-overhead-bound (CPU, the launch-bound analogue): time outside ATen ops >= this share."""
COMPUTE_OPS = 0.40
"""Compute-bound (CPU): matmul / conv / attention hold at least this share of op self time."""
MEMORY_FRACTION = 0.85
"""Memory-bound: the CUDA reserved peak is at least this share of the device's memory."""

_COMPUTE_CATEGORIES = ("matmul", "conv", "attention")


@dataclass(kw_only=True, slots=True)
class Bottleneck:
    """The baseline's bottleneck class, the other classes that also hold, and the evidence."""

    kind: str = "unknown"
    """The strongest class (:data:`KINDS`), or ``unknown`` when the record cannot tell."""
    also: list[str] = field(default_factory=list)
    """Other classes whose condition holds, strongest first."""
    evidence: dict[str, str] = field(default_factory=dict)
    """One line per class that holds (and ``unknown`` for why nothing could be classified)."""
    shares: dict[str, float] = field(default_factory=dict)
    """Median share of the step: ``data``, ``forward``, ``backward``, ``optimizer``, ``other``."""
    measures: dict[str, float] = field(default_factory=dict)
    """The profile figures used (``gpu_idle``, ``short_kernels``, ``host_gap``, ``compute_ops``, ...)."""
    device: str = "cpu"

    def order(self) -> list[str]:
        """Classes in the order their knobs are tried."""
        return [k for k in [self.kind, *self.also] if k in KINDS]

    def why(self, kind: str) -> str:
        """``launch-bound (GPU idle 62% of the step)``: the class with its evidence."""
        return f"{kind}-bound ({self.evidence.get(kind, 'no evidence')})"

    def summary(self) -> str:
        """One line for the console: the class and its evidence, then the other classes."""
        if self.kind not in KINDS:
            return f"bottleneck not classified: {self.evidence.get('unknown', 'no profile')}"
        text = self.why(self.kind)
        if self.also:
            text += "; also " + ", ".join(self.why(k) for k in self.also)
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON form (kept in the baseline's facts, ``facts["bottleneck"]``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Bottleneck:
        """Read back, ignoring unknown keys."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


def step_shares(steps: list[Any]) -> dict[str, float]:
    """Median share of each part of the step over the measured, unprofiled steps."""
    rows = [
        s
        for s in steps
        if not getattr(s, "warmup", False) and not getattr(s, "profiled", False) and s.total_ms > 0
    ]
    if not rows:
        return {}
    out = {}
    for part in ("data", "forward", "backward", "optimizer", "other"):
        out[part] = statistics.median(getattr(s, f"{part}_ms") / s.total_ms for s in rows)
    out["step_ms"] = statistics.median(s.total_ms for s in rows)
    return out


def profile_measures(rank: dict[str, Any]) -> dict[str, float]:
    """Figures from one rank of :func:`torchscalpel.trace.analyze.analyze_file` (profiled steps)."""
    out: dict[str, float] = {}
    steps = [s for s in rank.get("steps") or [] if s.get("dur_us")]
    if steps:
        dur = sum(s["dur_us"] for s in steps)
        busy = sum(s.get("cpu_busy_us", 0.0) for s in steps)
        out["host_gap"] = max(0.0, 1.0 - busy / dur)
        cats: dict[str, float] = {}
        for s in steps:
            for cat, us in (s.get("cpu_categories") or {}).items():
                cats[cat] = cats.get(cat, 0.0) + us
        total = sum(v for k, v in cats.items() if k != "autograd") or 0.0
        if total > 0:
            out["compute_ops"] = sum(cats.get(c, 0.0) for c in _COMPUTE_CATEGORIES) / total
            # GEMMs alone: what inductor's C++ GEMM templates (max-autotune on a CPU) can replace
            out["gemm_ops"] = cats.get("matmul", 0.0) / total
        if any("gpu_busy_us" in s for s in steps):
            gpu_busy = sum(s.get("gpu_busy_us", 0.0) for s in steps)
            out["gpu_idle"] = max(0.0, 1.0 - gpu_busy / dur)
            out["host_over_gpu"] = busy / gpu_busy if gpu_busy else float("inf")
    launch = rank.get("launch") or {}
    if launch.get("kernels"):
        out["short_kernels"] = launch.get("short_kernel_pct", 0.0) / 100.0
        out["kernels_per_step"] = launch["kernels"] / max(1, len(steps))
    return out


def classify(
    *, device: str, shares: dict[str, float], measures: dict[str, float], memory_fraction: float | None = None
) -> Bottleneck:
    """The bottleneck class from the step split and the profile figures (pure; see the module doc)."""
    found: dict[str, tuple[float, str]] = {}  # kind -> (strength: value / threshold, evidence)
    data = shares.get("data", 0.0)
    if data >= DATA_SHARE:
        found["data"] = (data / DATA_SHARE, f"DataLoader wait {data:.0%} of the step")
    opt = shares.get("optimizer", 0.0)
    if opt >= OPTIMIZER_SHARE:
        found["optimizer"] = (opt / OPTIMIZER_SHARE, f"optimizer.step {opt:.0%} of the step")
    if memory_fraction is not None and memory_fraction >= MEMORY_FRACTION:
        # Near the limit comes first: other knobs' candidates (autotuning, more workers) may not fit.
        found["memory"] = (100.0 * memory_fraction, f"peak {memory_fraction:.0%} of the GPU's memory")
    if device == "cuda":
        idle = measures.get("gpu_idle")
        short = measures.get("short_kernels")
        host_heavy = measures.get("host_over_gpu", 0.0) >= 1.0
        if idle is not None and (
            idle >= GPU_IDLE or (short is not None and short >= SHORT_KERNELS and host_heavy)
        ):
            parts = [f"GPU idle {idle:.0%} of the step"]
            if short is not None:
                parts.append(f"{short:.0%} of kernels < 10 µs")
            if host_heavy:
                parts.append("host op time >= GPU time")
            strength = max(idle / GPU_IDLE, (short or 0.0) / SHORT_KERNELS if host_heavy else 0.0)
            found["launch"] = (strength, ", ".join(parts))
        elif idle is not None:
            found["compute"] = ((1.0 - idle) / (1.0 - GPU_IDLE), f"GPU busy {1 - idle:.0%} of the step")
    else:
        gap = measures.get("host_gap")
        if gap is not None and gap >= HOST_GAP:
            found["launch"] = (
                gap / HOST_GAP,
                f"host overhead: {gap:.0%} of the step outside ATen ops (Python, module calls, dispatch)",
            )
        ops = measures.get("compute_ops")
        if ops is not None and ops >= COMPUTE_OPS:
            found["compute"] = (ops / COMPUTE_OPS, f"matmul/conv/attention {ops:.0%} of op time")
    result = Bottleneck(shares=dict(shares), measures=dict(measures), device=device)
    if not found:
        if not measures:
            result.evidence["unknown"] = "no profile of the baseline (knobs are tried in registry order)"
        else:
            result.evidence["unknown"] = "no class holds: the step is spread evenly"
        return result
    ranked = sorted(found, key=lambda k: -found[k][0])
    result.kind, result.also = ranked[0], ranked[1:]
    result.evidence = {k: found[k][1] for k in ranked}
    return result


def memory_fraction(record: RunRecord) -> float | None:
    """CUDA reserved peak over the device's memory, when both are known."""
    peaks = [s.cuda_reserved_peak for s in record.steps if s.cuda_reserved_peak]
    gpus = (record.environment or {}).get("gpus") or []
    total = next((g.get("memory_bytes") or g.get("total_memory") for g in gpus if isinstance(g, dict)), None)
    if not peaks or not total:
        return None
    return max(peaks) / float(total)


def classify_record(record: RunRecord, trace: Path | None) -> Bottleneck:
    """Classify a Run record (and its profiler trace, when there is one)."""
    device = str((record.config or {}).get("device") or "cpu").split(":")[0]
    measures: dict[str, float] = {}
    note = ""
    if trace is not None and trace.exists():
        try:
            from torchscalpel.trace.analyze import analyze_file

            rank, _, _ = analyze_file(trace)
            measures = profile_measures(rank)
        except Exception as exc:  # an unreadable trace must not stop the search
            note = f"the baseline's trace could not be read ({exc!r})"
    else:
        note = "the baseline was not profiled"
    result = classify(
        device=device,
        shares=step_shares(record.steps),
        measures=measures,
        memory_fraction=memory_fraction(record),
    )
    if note and result.kind == "unknown":
        result.evidence["unknown"] = note
    return result


def classify_trial(trial: TrialResult) -> Bottleneck:
    """Classify the baseline facts trial from the record and trace in its folder (never raises)."""
    from torchscalpel.errors import ScalpelError
    from torchscalpel.record import load_record

    try:
        record = load_record(Path(trial.out_dir))
    except (ScalpelError, OSError, ValueError) as exc:
        return Bottleneck(evidence={"unknown": f"the baseline's record could not be read ({exc})"})
    name = (record.profiler or {}).get("trace") or "trace.json.gz"
    return classify_record(record, Path(trial.out_dir) / name)

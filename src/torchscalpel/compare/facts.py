"""Per-run figures a comparison lines up: step time and its noise, phases, memory, throughput, losses."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from torchscalpel.record import PHASES, RunRecord


@dataclass(kw_only=True, slots=True)
class RunFacts:
    """What one run measured, reduced to the numbers compared side by side."""

    steps: int = 0
    """Measured steps the step-time figures cover (profiled steps left out when others exist)."""
    median_step_ms: float | None = None
    noise: float | None = None
    """Median absolute deviation of the step time over its median: this run's own spread."""
    phase_median_ms: dict[str, float] = field(default_factory=dict)
    phase_mean_ms: dict[str, float] = field(default_factory=dict)
    """Kept in ``--json`` only: the table, the chart and the verdict all read ``phase_median_ms``."""
    phase_noise: dict[str, float] = field(default_factory=dict)
    step_ms: list[float | None] = field(default_factory=list)
    """Every step's wall time by step index (warm-up included), for the overlaid curves."""
    losses: list[float | None] = field(default_factory=list)
    """Every step's loss by step index (None where none was recorded)."""
    memory: dict[str, int] = field(default_factory=dict)
    """Peaks: ``allocator_peak`` (profiler window), ``cuda_allocated_peak``, ``cuda_reserved_peak``, ``rss_peak``."""
    throughput: dict[str, float] = field(default_factory=dict)
    """``samples_per_s``, ``steps_per_s``, ``flops_per_s``, ``mfu`` where the record has them."""
    load: float | None = None
    """The machine's 1-minute load average when the run started (``environment.cpu.load_avg_1m``)."""
    cores: int | None = None
    """The cores the run could use, beside ``load``."""
    busy: bool = False
    """The machine was busy (other processes could keep every usable core busy: ``scalpel env``'s rule)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return asdict(self)


def _mad_ratio(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    med = statistics.median(values)
    if not med:
        return None
    return statistics.median(abs(v - med) for v in values) / med


def run_facts(record: RunRecord) -> RunFacts:
    """The comparable figures of ``record`` (empty where it measured nothing)."""
    plain = record.timed_steps
    facts = RunFacts(steps=len(plain))
    facts.step_ms = [s.total_ms for s in record.steps]
    facts.losses = [s.loss for s in record.steps]
    if plain:
        totals = [s.total_ms for s in plain]
        facts.median_step_ms = statistics.median(totals)
        facts.noise = _mad_ratio(totals)
        for phase in PHASES:
            values = [s.phase_ms()[phase] for s in plain]
            median = statistics.median(values)  # once: inside the generator it made 800k steps quadratic
            facts.phase_median_ms[phase] = median
            facts.phase_mean_ms[phase] = statistics.fmean(values)
            spread = statistics.median(abs(v - median) for v in values)
            facts.phase_noise[phase] = spread
    summary = record.summary_view()
    mem = record.op_summary_view().memory or {}
    peaks = {
        "allocator_peak": mem.get("peak_bytes"),
        "cuda_allocated_peak": summary.cuda_allocated_peak,
        "cuda_reserved_peak": summary.cuda_reserved_peak,
        "rss_peak": summary.rss_peak,
    }
    facts.memory = {k: int(v) for k, v in peaks.items() if isinstance(v, int | float) and v}
    tp: dict[str, float] = {}
    if summary.samples_per_s:
        tp["samples_per_s"] = float(summary.samples_per_s)
    if facts.median_step_ms:
        tp["steps_per_s"] = 1000.0 / facts.median_step_ms
    if summary.achieved_flops_per_s:
        tp["flops_per_s"] = float(summary.achieved_flops_per_s)
    if summary.mfu and isinstance(summary.mfu.get("mfu"), int | float):
        tp["mfu"] = float(summary.mfu["mfu"])
    facts.throughput = tp
    _load(facts, record)
    return facts


def _load(facts: RunFacts, record: RunRecord) -> None:
    """The machine load the record holds, and whether ``scalpel env``'s busy-machine rule fires on it."""
    from torchscalpel.envcheck.host_checks import check_machine_busy

    env = record.environment if isinstance(record.environment, dict) else {}
    cpu = env.get("cpu")
    if not isinstance(cpu, dict):
        cpu = {}
    load, cores = cpu.get("load_avg_1m"), cpu.get("usable_cores") or env.get("cpu_count")
    if isinstance(load, int | float) and not isinstance(load, bool) and load >= 0:
        facts.load = float(load)
    if isinstance(cores, int) and not isinstance(cores, bool) and cores > 0:
        facts.cores = cores
    if facts.load is not None and facts.cores is not None:
        facts.busy = bool(
            check_machine_busy({"cpu": {"load_avg_1m": facts.load, "usable_cores": facts.cores}})
        )


@dataclass(kw_only=True, slots=True)
class LossMatch:
    """How two loss curves agree over the steps both recorded."""

    compared: int = 0
    """Steps where both runs recorded a loss."""
    identical: bool = False
    """Bit-identical over every compared step."""
    first_diff_step: int | None = None
    max_abs_diff: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return asdict(self)


def loss_match(a: list[float | None], b: list[float | None]) -> LossMatch:
    """Compare two loss curves step by step, exactly (``==`` on the stored floats)."""
    pairs = [(i, x, y) for i, (x, y) in enumerate(zip(a, b, strict=False)) if x is not None and y is not None]
    out = LossMatch(compared=len(pairs))
    if not pairs:
        return out
    diffs = [(i, abs(x - y)) for i, x, y in pairs if not _same(x, y)]
    out.identical = not diffs
    if diffs:
        out.first_diff_step = diffs[0][0]
        out.max_abs_diff = max(d for _, d in diffs)
    else:
        out.max_abs_diff = 0.0
    return out


def _same(x: float, y: float) -> bool:
    """Equal to the bit, NaN matching NaN (a run that diverged the same way twice is identical)."""
    return x == y or (x != x and y != y)

"""The record's ``summary``: medians and shares over measured, unprofiled steps."""

from __future__ import annotations

import statistics
from typing import Any

from torchscalpel.record import NOT_TIMED, PHASES, RunRecord
from torchscalpel.sections import RunSummary


def summarize(record: RunRecord) -> dict[str, Any]:
    """:func:`run_summary` as the JSON data stored in ``record.summary``."""
    return run_summary(record).to_dict()


def run_summary(record: RunRecord) -> RunSummary:
    """Step-time statistics, the five-way split (means, which sum to the mean step), throughput, memory.

    Instrumented steps (profiled, FLOP-counted, op-line) are left out, since the instruments slow them;
    when every measured step was instrumented there is no step time (``step_time_not_measured`` says so)
    rather than one read from a slowed step. ``breakdown_max_error`` is the largest per-step gap between
    the phase sum and the step time.
    """
    measured = record.measured_steps
    plain = record.timed_steps
    out = RunSummary(steps_total=len(record.steps), steps_measured=len(measured), steps_summarized=len(plain))
    if not plain:
        if measured:
            out.step_time_not_measured = NOT_TIMED
        _losses_and_memory(out, record)
        _flops(out, record)
        return out
    totals = sorted(s.total_ms for s in plain)
    mean_total = statistics.fmean(totals)
    phase_mean = {p: statistics.fmean(s.phase_ms()[p] for s in plain) for p in PHASES}
    out.median_step_ms = statistics.median(totals)
    out.mean_step_ms = mean_total
    out.min_step_ms = totals[0]
    out.p90_step_ms = totals[min(len(totals) - 1, int(0.9 * len(totals)))]
    out.phase_mean_ms = phase_mean
    out.phase_share = {p: (v / mean_total if mean_total else 0.0) for p, v in phase_mean.items()}
    # The tables show medians: their share column is the share of the median step, so a phase's
    # figure and its share are the same statistic (one outlier step cannot inflate a share).
    median_total = out.median_step_ms
    out.phase_median_ms = {p: statistics.median(s.phase_ms()[p] for s in plain) for p in PHASES}
    out.phase_median_share = {
        p: (v / median_total if median_total else 0.0) for p, v in out.phase_median_ms.items()
    }
    if any(s.eval_ms for s in plain):
        out.training_step_ms = statistics.median(s.training_ms for s in plain)
    out.breakdown_max_error = max(
        abs(sum(s.phase_ms().values()) - s.total_ms) / s.total_ms if s.total_ms else 0.0 for s in plain
    )
    samples = [s.samples for s in plain if s.samples]
    if samples and mean_total:
        out.samples_per_s = statistics.fmean(samples) / (mean_total / 1000.0)
    else:  # never a silent gap: the runtime replaces this with what it saw, when it saw why
        out.samples_per_s_not_measured = (
            "no measured step recorded how many samples it trained on"
            if mean_total
            else "the measured steps took no time on this clock"
        )
    _losses_and_memory(out, record)
    _flops(out, record)
    return out


def _losses_and_memory(out: RunSummary, record: RunRecord) -> None:
    """First and last loss, memory peaks: every step holds them, instrumented or not."""
    losses = [s.loss for s in record.steps if s.loss is not None]
    if losses:
        out.first_loss, out.last_loss = losses[0], losses[-1]
    rss = [s.rss for s in record.steps if s.rss]
    if rss:
        out.rss_peak = max(rss)
    cuda = [s.cuda_allocated_peak for s in record.steps if s.cuda_allocated_peak is not None]
    if cuda:
        out.cuda_allocated_peak = max(cuda)
        out.cuda_reserved_peak = max(s.cuda_reserved_peak or 0 for s in record.steps)


def _flops(out: RunSummary, record: RunRecord) -> None:
    """FLOPs per step from the FLOP-counting step, and FLOP/s and MFU from it and the median step (less its
    evaluation forwards, when steps held any)."""
    profiler = record.profiler_view()
    if profiler.flops_step is None:
        out.flops_not_measured = profiler.flops_not_measured
        return
    if not profiler.flops_total:
        out.flops_not_measured = (
            f"no op with a FLOP formula (matmul, convolution, attention) ran in step {profiler.flops_step}"
        )
        return
    out.flops_per_step = float(profiler.flops_total)
    out.recompute_flops_per_step = float(profiler.flops_recompute or 0)
    if profiler.flops_eval:
        out.eval_flops = float(profiler.flops_eval)
    step_ms = out.training_step_ms or out.median_step_ms  # the training time: evaluation forwards left out
    if step_ms:
        out.achieved_flops_per_s = out.flops_per_step / (step_ms / 1000.0)
        from torchscalpel.runtime.peaks import mfu

        out.mfu = mfu(out.achieved_flops_per_s, record.environment, record.config_view().device) or None


UNCOUNTED_SHARE = 0.03
"""An op with no FLOP formula is named beside the FLOPs when it takes more than this share of op time."""


def uncounted_ops(record: RunRecord) -> list[dict[str, Any]]:
    """The ops the FLOP-counting step ran with no FLOP formula (``profiler.flops_unformulated``) that took more
    than :data:`UNCOUNTED_SHARE` of the profiler window's op time: ``name`` and ``share`` (its time, children
    included, over all ops' self time), largest first. What FLOPs per step and FLOP/s leave out."""
    names = record.profiler_view().flops_unformulated
    trace = record.op_summary_view()
    table = trace.op_table or {
        str(o.get("name")): [
            o.get("count", 0),
            o.get("self_us", 0.0),
            o.get("total_us", o.get("self_us", 0.0)),
        ]
        for o in trace.top_ops
    }
    total = sum(v[1] for v in table.values() if len(v) > 2)
    if not names or not total:
        return []
    rows = []
    for name in names:
        v = table.get(name)
        if v is None or len(v) < 3:
            continue
        share = min(float(v[2]) / total, 1.0)
        if share > UNCOUNTED_SHARE:
            rows.append({"name": name, "share": share})
    return sorted(rows, key=lambda r: -r["share"])

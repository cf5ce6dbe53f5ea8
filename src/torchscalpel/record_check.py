"""Invariants every Run record must keep: ``check_invariants(record_or_path)`` lists the broken ones.

Any test, benchmark or user can run it on a ``run.json``; each violation is one sentence naming the field.
The rules are about consistency between figures one record holds (never about how fast a run was):

- steps: every phase and step time a finite number >= 0, the five phases summing to the step
  (the runtime stores ``other = total - the measured phases``), step indices increasing, warm-up first;
- the profiler window: its steps are recorded training steps, after warm-up, and exactly the steps
  marked ``profiled`` (the FLOP-counting step aside);
- FLOPs: ``flops_total``, every op's ``flops`` and ``flops_per_step`` >= 0; a per-op list that says it
  is complete (a counted ``flops_step``, or ``flops_by_op_complete``) sums to ``flops_total``;
- the summary: its step statistics are those of the steps it says it covers (the measured steps no
  instrument slowed: none, and no step time, when every measured step was instrumented); phase means sum
  to the mean step, shares are phase mean / mean step; samples/s is mean samples / mean step; FLOP/s is
  FLOPs per step / median step (less its evaluation forwards, ``training_step_ms``, when steps held any);
  MFU is FLOP/s over the peak recorded beside it;
- tune: every speedup is the ratio of the two step times recorded beside it (``baseline_ms /
  median_ms``; each confirmation pair's ratio), and the winner's speedup is the confirmed one;
- lr: a suggestion (``suggestion``, ``min_over_10``) only from a sweep that measured its curve (it ran every
  step it needed or diverged), and none beside a ``not_measured`` reason;
- no NaN or infinity where a number is promised (losses excepted: a diverged run's NaN loss is a fact).

What one value alone can say (its type, a time or a count >= 0, a finite rate) is refused earlier, by
:func:`~torchscalpel.record.load_record` for every reader (:func:`torchscalpel.sections.check_parts`): a record
that loads renders and patches without a traceback; this check is what only the whole record can say.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterator
from typing import Any, TypeGuard

from torchscalpel.record import PHASES, RunRecord, load_record

PHASE_TOLERANCE = 0.01
"""Phases may differ from their step by this share of it (clock rounding), or by :data:`ABS_TOLERANCE_MS`."""
ABS_TOLERANCE_MS = 0.01
RATIO_TOLERANCE = 0.01
"""A recorded ratio may differ from the ratio of the figures beside it by this share (rounded figures)."""

_NOT_PROMISED = ("loss", "deviation", "tolerance")
"""Keys whose NaN is a measurement of the script (a diverged loss and what is computed from it)."""


def check_invariants(record_or_path: RunRecord | str | os.PathLike[str]) -> list[str]:
    """Every invariant ``record_or_path`` (a record, a run folder or its run.json) breaks, one sentence each."""
    record = record_or_path if isinstance(record_or_path, RunRecord) else load_record(record_or_path)
    out: list[str] = []
    out += _steps(record)
    out += _window(record)
    out += _flops(record)
    out += _summary(record)
    out += _tune(record)
    out += _lr(record)
    out += _finite(record)
    return out


def _close(a: float, b: float, rel: float = RATIO_TOLERANCE, abs_tol: float = 1e-9) -> bool:
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_tol)


def _num(value: object) -> TypeGuard[float]:
    # A TypeGuard: after ``_num(x) and ...`` a type checker knows x is a number (an int passes as a float).
    return isinstance(value, int | float) and not isinstance(value, bool)


def _steps(record: RunRecord) -> list[str]:
    out = []
    seen_measured = None
    for pos, s in enumerate(record.steps):
        where = f"steps[{pos}] (index {s.index})"
        timed = {"total_ms": s.total_ms, **{f"{p}_ms": v for p, v in s.phase_ms().items()}}
        bad = [k for k, v in timed.items() if not _num(v) or not math.isfinite(v) or v < 0]
        if bad:
            out.append(
                f"{where}: {', '.join(bad)} not a finite time >= 0 ({', '.join(f'{k}={timed[k]!r}' for k in bad)})."
            )
            continue
        phase_sum = sum(s.phase_ms().values())
        if abs(phase_sum - s.total_ms) > max(PHASE_TOLERANCE * s.total_ms, ABS_TOLERANCE_MS):
            out.append(
                f"{where}: the phases sum to {phase_sum:.3f} ms but total_ms is {s.total_ms:.3f} ms "
                f"(more than {PHASE_TOLERANCE:.0%} apart)."
            )
        if pos and s.index <= record.steps[pos - 1].index:
            out.append(
                f"{where}: step index {s.index} does not increase (the step before is "
                f"{record.steps[pos - 1].index})."
            )
        if not s.warmup and seen_measured is None:
            seen_measured = s.index
        elif s.warmup and seen_measured is not None:
            out.append(f"{where}: a warm-up step after measured step {seen_measured}.")
    return out


def _window(record: RunRecord) -> list[str]:
    window = record.profiler_view().steps
    # The FLOP-counting step is marked profiled (left out of timings, like the window's steps) but is not
    # inside the profiler window: it ran under the counting mode instead.
    marked = [s.index for s in record.steps if s.profiled and not s.flops_counted and not s.op_lines]
    if window is None:
        return (
            [f"steps {marked}: marked profiled but the record has no profiler window (profiler.steps)."]
            if marked
            else []
        )
    out = []
    by_index = {s.index: s for s in record.steps}
    outside = [i for i in window if i not in by_index]
    if outside:
        out.append(
            f"profiler.steps {outside}: not among the recorded training steps "
            f"({len(record.steps)} recorded, indices {_span(list(by_index))})."
        )
    warm = [i for i in window if i in by_index and by_index[i].warmup]
    if warm:
        out.append(f"profiler.steps {warm}: warm-up steps inside the profiler window.")
    if sorted(set(window) & set(by_index)) != sorted(marked):
        out.append(f"profiler.steps {list(window)} and the steps marked profiled {marked} differ.")
    return out


def _span(indices: list[int]) -> str:
    return f"{min(indices)}-{max(indices)}" if indices else "none"


def _flops(record: RunRecord) -> list[str]:
    prof = record.profiler_view()
    out = []
    if prof.flops_total is not None and (not _num(prof.flops_total) or prof.flops_total < 0):
        out.append(f"profiler.flops_total is {prof.flops_total!r}, not a count >= 0.")
    for i, op in enumerate(prof.flops_by_op or []):
        flops = op.get("flops") if isinstance(op, dict) else None
        if flops is not None and (not _num(flops) or flops < 0):
            out.append(f"profiler.flops_by_op[{i}] ({op.get('name')}): flops is {flops!r}, not a count >= 0.")
    per_step = record.summary_view().flops_per_step
    if per_step is not None and (not _num(per_step) or per_step < 0):
        out.append(f"summary.flops_per_step is {per_step!r}, not a count >= 0.")
    # A counted step (flops_step) lists every op that counted, so its total must be their sum.
    complete = prof.flops_step is not None or prof.extra.get("flops_by_op_complete")
    if complete and _num(prof.flops_total):
        listed = sum(op.get("flops") or 0 for op in prof.flops_by_op if isinstance(op, dict))
        if not _close(listed, prof.flops_total, 1e-3):
            out.append(
                f"profiler.flops_by_op says it is complete but sums to {listed:.6g} FLOPs, not "
                f"profiler.flops_total {prof.flops_total:.6g}."
            )
    return out


def _summary(record: RunRecord) -> list[str]:
    if not record.summary:
        return []
    s = record.summary_view()
    measured = record.measured_steps
    plain = record.timed_steps
    out = []
    if (
        s.steps_total != len(record.steps)
        or s.steps_measured != len(measured)
        or s.steps_summarized != len(plain)
    ):
        out.append(
            f"summary.steps_total/steps_measured/steps_summarized are {s.steps_total}/{s.steps_measured}/"
            f"{s.steps_summarized}, the steps recorded give {len(record.steps)}/{len(measured)}/{len(plain)}."
        )
        return out  # the statistics below cover other steps than the record holds: each would repeat this
    if measured and not plain and s.median_step_ms is not None:
        out.append(
            f"summary.median_step_ms is {s.median_step_ms!r} though every measured step was instrumented: "
            "a step time never comes from an instrumented step."
        )
    if not plain or any(not _num(x.total_ms) or not math.isfinite(x.total_ms) for x in plain):
        return out
    totals = [x.total_ms for x in plain]
    mean = statistics.fmean(totals)
    for name, value, expect in (
        ("median_step_ms", s.median_step_ms, statistics.median(totals)),
        ("mean_step_ms", s.mean_step_ms, mean),
        ("min_step_ms", s.min_step_ms, min(totals)),
    ):
        if _num(value) and not _close(value, expect, 1e-6, 1e-9):
            out.append(
                f"summary.{name} is {value:.4f} ms; the {len(plain)} summarized steps give {expect:.4f} ms."
            )
    if s.phase_mean_ms and _num(s.mean_step_ms):
        phase_sum = sum(v for v in s.phase_mean_ms.values() if _num(v))
        if abs(phase_sum - s.mean_step_ms) > max(PHASE_TOLERANCE * s.mean_step_ms, ABS_TOLERANCE_MS):
            out.append(
                f"summary.phase_mean_ms sums to {phase_sum:.3f} ms, not summary.mean_step_ms "
                f"{s.mean_step_ms:.3f} ms."
            )
        for p in PHASES:
            share, pm = (s.phase_share or {}).get(p), s.phase_mean_ms.get(p)
            if (
                _num(share)
                and _num(pm)
                and s.mean_step_ms
                and not _close(share, pm / s.mean_step_ms, RATIO_TOLERANCE, 1e-6)
            ):
                out.append(
                    f"summary.phase_share.{p} is {share:.4f}; phase_mean_ms.{p} / mean_step_ms is "
                    f"{pm / s.mean_step_ms:.4f}."
                )
    samples = [x.samples for x in plain if x.samples]
    if _num(s.samples_per_s) and samples and mean:
        expect = statistics.fmean(samples) / (mean / 1000.0)
        if not _close(s.samples_per_s, expect):
            out.append(
                f"summary.samples_per_s is {s.samples_per_s:.4g}; the steps' mean samples "
                f"{statistics.fmean(samples):.4g} over the mean step {mean:.4g} ms give {expect:.4g}."
            )
    if _num(s.training_step_ms):
        expect = statistics.median(x.training_ms for x in plain)
        if not _close(s.training_step_ms, expect, 1e-6, 1e-9):
            out.append(
                f"summary.training_step_ms is {s.training_step_ms:.4f} ms; the summarized steps less their "
                f"evaluation forwards give {expect:.4f} ms."
            )
    step_ms, which = (
        (s.training_step_ms, "training_step_ms")
        if _num(s.training_step_ms)
        else (s.median_step_ms, "median_step_ms")
    )
    if _num(s.achieved_flops_per_s) and _num(s.flops_per_step) and _num(step_ms) and step_ms:
        expect = s.flops_per_step / (step_ms / 1000.0)
        if not _close(s.achieved_flops_per_s, expect):
            out.append(
                f"summary.achieved_flops_per_s is {s.achieved_flops_per_s:.4g}; flops_per_step over "
                f"{which} gives {expect:.4g}."
            )
    mfu = s.mfu or {}
    peak = mfu.get("peak_tflops_bf16")
    if _num(mfu.get("mfu")) and _num(peak) and peak and _num(s.achieved_flops_per_s):
        expect = s.achieved_flops_per_s / (peak * 1e12)
        if not _close(mfu["mfu"], expect):
            out.append(
                f"summary.mfu.mfu is {mfu['mfu']:.4g}; achieved_flops_per_s over "
                f"peak_tflops_bf16 {peak:g} TFLOP/s gives {expect:.4g}."
            )
    return out


def _tune(record: RunRecord) -> list[str]:
    tune = record.sections.get("tune")
    if not isinstance(tune, dict):
        return []
    out = []
    trials = [t for t in [tune.get("baseline"), *(tune.get("trials") or [])] if isinstance(t, dict)]
    for t in trials:
        label = t.get("label") or t.get("family") or "?"
        sp, base, med = t.get("speedup"), t.get("baseline_ms"), t.get("median_ms")
        pair = t.get("speedup_pair")
        if isinstance(pair, list) and len(pair) == 2 and all(_num(x) for x in pair) and pair[1]:
            # tune's one definition (tune/speedup.py): the speedup is the ratio of the pair stored beside
            # it, and that pair is one the candidate was measured in (a confirmation pair, else screening).
            if _num(sp) and not _close(sp, pair[0] / pair[1]):
                out.append(
                    f"sections.tune trial {label!r}: speedup {sp:.3f}x but its speedup_pair is "
                    f"{pair[0]:.3f} / {pair[1]:.3f} ms = {pair[0] / pair[1]:.3f}x."
                )
            measured = [p for p in t.get("confirm_pairs") or [] if len(p) == 2] or [[base, med]]
            if t.get("verdict") != "baseline" and not any(
                _num(b) and _num(c) and _close(b, pair[0]) and _close(c, pair[1]) for b, c in measured
            ):
                out.append(
                    f"sections.tune trial {label!r}: speedup_pair {pair} is not a pair it was measured in "
                    f"({measured})."
                )
        elif _num(sp) and _num(base) and _num(med) and med and not _close(sp, base / med):
            out.append(
                f"sections.tune trial {label!r}: speedup {sp:.3f}x but baseline_ms / median_ms is "
                f"{base:.3f} / {med:.3f} = {base / med:.3f}x."
            )
        for ratio, cpair in zip(t.get("confirm_ratios") or [], t.get("confirm_pairs") or [], strict=False):
            ok = _num(ratio) and len(cpair) == 2 and all(_num(x) for x in cpair) and cpair[1]
            if ok and not _close(ratio, cpair[0] / cpair[1]):
                out.append(
                    f"sections.tune trial {label!r}: confirmation ratio {ratio:.3f}x but its pair is "
                    f"{cpair[0]:.3f} / {cpair[1]:.3f} ms = {cpair[0] / cpair[1]:.3f}x."
                )
    winner, confirmed = tune.get("winner"), tune.get("confirmed_speedup")
    if isinstance(winner, dict) and _num(confirmed):
        sp = winner.get("speedup")
        if _num(sp) and not _close(sp, confirmed):
            out.append(
                f"sections.tune.winner {winner.get('label')!r}: speedup {sp:.3f}x differs from "
                f"confirmed_speedup {confirmed:.3f}x (one candidate, two ratios shown)."
            )
    return out


def _lr(record: RunRecord) -> list[str]:
    lr = record.sections.get("lr")
    if not isinstance(lr, dict):
        return []
    given = [k for k in ("suggestion", "min_over_10") if lr.get(k) is not None]
    if not given:
        return []
    out = []
    points, steps = lr.get("points"), lr.get("steps")
    if lr.get("not_measured"):
        out.append(f"sections.lr: {' and '.join(given)} given beside not_measured ({lr['not_measured']!r}).")
    if isinstance(points, list) and _num(steps) and len(points) < steps and lr.get("divergence") is None:
        reached = points[-1].get("lr") if points and isinstance(points[-1], dict) else None
        out.append(
            f"sections.lr: {' and '.join(given)} from a sweep of {len(points)} of its {steps} steps that did not "
            f"diverge (nothing past lr {reached!r} was measured)."
        )
    return out


def _walk(value: Any, path: str) -> Iterator[tuple[str, float]]:
    if isinstance(value, dict):
        for k, v in value.items():
            if not any(word in str(k).lower() for word in _NOT_PROMISED):
                yield from _walk(v, f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    elif isinstance(value, float):
        yield path, value


def _finite(record: RunRecord) -> list[str]:
    out = []
    parts = {
        "summary": record.summary,
        "profiler": record.profiler,
        "sections": record.sections,
        "modules": record.modules,
    }
    for name, data in parts.items():
        for path, value in _walk(data, name):
            if not math.isfinite(value):
                out.append(f"{path} is {value}, where a number is promised.")
    for pos, s in enumerate(record.steps):
        for f in ("cuda_allocated_peak", "cuda_reserved_peak", "rss", "samples"):
            v = getattr(s, f)
            if isinstance(v, float) and not math.isfinite(v):
                out.append(f"steps[{pos}].{f} is {v}, where a number is promised.")
    return out

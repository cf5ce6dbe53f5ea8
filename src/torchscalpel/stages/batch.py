"""The batch stage (``scalpel batch``): one run per batch size, samples/s each, the best named, run.json saved."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchscalpel.record import RunRecord
from torchscalpel.sections import BatchSection
from torchscalpel.stages.saving import save_with_report
from torchscalpel.tune.batch_finder import BatchOptions


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchResult:
    """One ``scalpel batch``: the record of the best size (or the last run), whose ``sections["batch"]`` holds
    every size's outcome, and where it was written."""

    record: RunRecord
    out_dir: Path
    report: Path | None
    """report.html, or None when none was asked for or it could not be rendered."""

    @property
    def section(self) -> BatchSection:
        """Every size's row, the best size and the learning-rate advice, as a typed view."""
        return self.record.section(BatchSection) or BatchSection()

    @property
    def best(self) -> int | None:
        """The size with the most samples/s (None when no size was measured)."""
        return self.section.best

    @property
    def exit_code(self) -> int:
        """0 when some size was measured, 1 otherwise."""
        return 0 if self.best is not None else 1


def run(options: BatchOptions, *, progress: Callable[[Any], None] | None = None) -> BatchResult:
    """Measure every size in ``options.sizes`` (ascending) over ``options.target``; the record of the best
    size (or the last run) carries ``sections["batch"]`` and is saved as ``run.json`` in ``options.out_dir``
    (default ``scalpel-runs/<time>-batch-<name>/``), then rendered as ``report.html``. ``progress``: once per
    step of every size's run."""
    from torchscalpel.fileio import default_run_dir
    from torchscalpel.runtime.session import RuntimeOptions, run_target
    from torchscalpel.tune.batch_finder import (
        ForcedBatch,
        OptimizerKind,
        best_size,
        not_resized,
        outcome,
        scaling_advice,
    )

    target = options.target
    if target is None:
        raise ValueError("the batch stage needs options.target (the script or module to measure)")
    out_dir = options.out_dir or default_run_dir(f"batch-{target.name}", options.out_root)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    records: dict[int, RunRecord] = {}
    base: int | None = None
    optimizer: str | None = None
    untouched = 0
    for size in sorted(options.sizes):
        forced, kind = ForcedBatch(size), OptimizerKind()
        runtime = RuntimeOptions(
            warmup=options.warmup,
            steps=options.steps,
            profile_steps=0,
            name=f"batch-{target.name}-{size}",
            step_timeout_s=options.step_timeout_s,
            step_scalars=False,
        )
        record = run_target(
            target, runtime, [kind], [forced], progress=progress, command=list(options.command)
        )
        records[size] = record
        base = base if base is not None else forced.original
        optimizer = optimizer or kind.kind
        untouched = max(untouched, forced.untouched)
        summary = record.summary_view()
        unset = not_resized(forced)
        if unset is not None:  # the run measured the script's own batch: no figure for this size
            rows.append(
                {
                    "batch_size": size,
                    "fits": None,
                    "outcome": "not measured",
                    "samples_per_s": None,
                    "median_step_ms": None,
                    "steps_measured": 0,
                    "why": unset,
                }
            )
            continue
        state, why = outcome(
            size=size,
            exit_code=record.exit_code,
            error=record.error,
            notes=record.notes,
            measured_steps=len(record.measured_steps),
            steps_seen=len(record.steps),
            samples=forced.samples,
            warmup=options.warmup,
            steps=options.steps,
        )
        fits = state == "measured"
        rows.append(
            {
                "batch_size": size,
                "fits": fits,
                "outcome": state,
                "samples_per_s": summary.samples_per_s if fits else None,
                "median_step_ms": summary.median_step_ms if fits else None,
                "steps_measured": len(record.measured_steps),
                "why": why,
            }
        )
    best = best_size(rows)
    section = {
        "sizes": sorted(options.sizes),
        "steps": options.steps,
        "warmup": options.warmup,
        "rows": rows,
        "best": best,
        "script_batch_size": base,
        "optimizer": optimizer,
        "advice": scaling_advice(optimizer, base, best),
        "loaders_untouched": untouched,
    }
    record = records[best] if best is not None else records[sorted(options.sizes)[-1]]
    record.sections["batch"] = section
    report = save_with_report(record, out_dir, write_report=options.report)
    return BatchResult(record=record, out_dir=out_dir, report=report)

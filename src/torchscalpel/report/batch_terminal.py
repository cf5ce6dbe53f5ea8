"""Terminal table of ``scalpel batch`` (reads ``sections["batch"]``; never measures)."""

from __future__ import annotations

from typing import Any

from torchscalpel.sections import BatchSection


def row_outcome(row: dict[str, Any]) -> str:
    """What became of one size: the row's ``outcome`` ("measured", "does not fit", "failed", "not measured").
    A record written before outcomes existed says "does not fit" only when its reason is out of memory:
    "does not fit" is said of a run that crossed a limit, never of one that ended with exit code 0."""
    state = row.get("outcome")
    if isinstance(state, str) and state in ("measured", "does not fit", "failed", "not measured"):
        return state
    if row.get("fits"):
        return "measured"
    return "does not fit" if "out of memory" in str(row.get("why") or "").lower() else "not measured"


def render(batch: BatchSection) -> list[str]:
    """One line per size, then the best size and the lr advice."""
    lines = [f"{'batch':>7}  {'samples/s':>10}  {'step ms':>9}"]
    for r in batch.rows:
        if row_outcome(r) == "measured":
            sps = f"{r['samples_per_s']:.1f}" if r.get("samples_per_s") else "not measured"
            ms = f"{r['median_step_ms']:.1f}" if r.get("median_step_ms") is not None else "-"
            mark = "  <- best" if r["batch_size"] == batch.best else ""
            few = r.get("steps_measured")
            if isinstance(few, int) and batch.steps is not None and few < batch.steps:
                mark += f"  ({few} of {batch.steps} steps: the script ended)"
            lines.append(f"{r['batch_size']:>7}  {sps:>10}  {ms:>9}{mark}")
        elif r.get("fits") is None:  # no DataLoader took the size: the script's own batch ran
            lines.append(f"{r['batch_size']:>7}  {r.get('why') or 'not measured'}")
        else:
            why = r.get("why") or "no reason recorded"
            lines.append(f"{r['batch_size']:>7}  {row_outcome(r)}: {why}")
    if batch.best is not None:
        base = f" (the script's: {batch.script_batch_size})" if batch.script_batch_size else ""
        lines.append(f"best samples/s at batch {batch.best}{base}")
    else:
        lines.append("best samples/s: not measured: no size was measured")
    lines.append(f"lr advice: {batch.advice}")
    if batch.loaders_untouched:
        lines.append(
            f"{batch.loaders_untouched} DataLoader(s) built with a batch_sampler or batch_size=None were left as they were"
        )
    return lines

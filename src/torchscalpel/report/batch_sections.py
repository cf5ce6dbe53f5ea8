"""HTML report section for ``scalpel batch``: reads ``record.sections["batch"]`` (never measures)."""

from __future__ import annotations

from html import escape

from torchscalpel.record import RunRecord
from torchscalpel.report.batch_terminal import row_outcome
from torchscalpel.report.charts import horizontal_bars
from torchscalpel.report.page import Section, table
from torchscalpel.sections import BatchSection


def _rows(batch: BatchSection) -> list[list[object]]:
    """One table row per size: samples/s, the median step, its share of the best's samples/s, or why it did not run."""
    best = next((r for r in batch.rows if r.get("batch_size") == batch.best), None)
    top = float(best["samples_per_s"]) if best and best.get("samples_per_s") else None
    out: list[list[object]] = []
    for r in batch.rows:
        size = r.get("batch_size")
        mark = " (best)" if size == batch.best else ""
        state = row_outcome(r)
        if state != "measured":
            out.append([f"{size}{mark}", state, "-", "-", r.get("why") or "no reason recorded"])
            continue
        sps = r.get("samples_per_s")
        ms = r.get("median_step_ms")
        out.append(
            [
                f"{size}{mark}",
                f"{sps:.1f}" if sps else "not measured: no timed step",
                f"{ms:.1f}" if ms is not None else "not measured: no timed step",
                f"{100 * sps / top:.0f}%" if sps and top else "-",
                "",
            ]
        )
    return out


def build(record: RunRecord) -> list[Section]:
    """One "Batch size" section: samples/s per size (bars and a table), the best size, the lr scaling advice."""
    batch = record.section(BatchSection)
    if batch is None:
        return []
    measured = [
        (f"batch {r['batch_size']}", float(r["samples_per_s"]))
        for r in batch.rows
        if row_outcome(r) == "measured" and r.get("samples_per_s")
    ]
    chart = horizontal_bars("batch-samples-per-s", measured, unit="samples/s", y_title="batch size")
    rows = table(
        ["batch size", "samples/s", "median step ms", "of the best", "why not measured"],
        _rows(batch),
        numeric=[False, True, True, True, False],
    )
    base = f" (the script's own: {batch.script_batch_size})" if batch.script_batch_size else ""
    if batch.best is not None:
        verdict = f"Best samples/s at batch <b>{batch.best}</b>{escape(base)}."
    else:
        verdict = "No size was measured (the table says why for each)."
    notes = [
        f"{batch.steps} measured step(s) after {batch.warmup} warm-up step(s) per size, each size a separate run "
        "with every DataLoader's batch_size set to it",
        f"lr advice: {batch.advice}"
        if batch.advice
        else "lr advice: not given (no optimizer or batch size seen)",
    ]
    if batch.loaders_untouched:
        notes.append(
            f"{batch.loaders_untouched} DataLoader(s) built with a batch_sampler or batch_size=None were left as they were"
        )
    items = "".join(f"<li>{escape(n)}</li>" for n in notes)
    body = f"<p>{verdict}</p>{chart}{rows}<ul>{items}</ul>"
    return [Section(id="batch", title="Batch size: samples/s", body=body)]

"""HTML report section for ``scalpel plan``: reads ``record.sections["plan"]`` (never measures)."""

from __future__ import annotations

from html import escape

from torchscalpel.record import RunRecord
from torchscalpel.report.charts import stacked_bars
from torchscalpel.report.html import Section, table
from torchscalpel.sections import PlanSection

_PARTS = (("params", "params"), ("grads", "grads"), ("optim", "optimizer"), ("activations", "activations"),
          ("comm", "comm buffers"), ("margin", "margin"))


def build(record: RunRecord) -> list[Section]:
    """One "Memory plan" section (none when the record holds no plan)."""
    plan = record.section(PlanSection)
    if plan is None or not plan.rows:
        return []
    mib = 1024**2
    rows = [*plan.rows, *plan.alternatives]
    labels = [r["strategy"] + (" +ckpt" if r.get("checkpointing") else "") for r in rows]
    chart = stacked_bars("plan-memory", labels, {name: [r.get(key, 0) / mib for r in rows] for key, name in _PARTS},
                         unit="MiB")
    device = plan.device
    body_rows = [
        [label, f"{r['peak'] / mib:.1f}", f"{r['needed'] / mib:.1f}", f"{r['capacity'] / mib:.0f}",
         "yes" if r["fits"] else "no", f"{r['headroom'] / mib:.1f}", r.get("max_batch") if r.get("max_batch") is not None else "-",
         f"{r['weights_optimizer_rule'] / mib:.1f}", r.get("phase", "")]
        for label, r in zip(labels, rows, strict=True)
    ]
    head = (f"<p>{escape(str(plan.model))} · batch per rank <code>{escape(str(plan.batch))}</code> · "
            f"{escape(str(plan.optimizer))} · {escape(str(plan.precision))} · "
            f"{plan.world_size} rank(s) · device {escape(str(device.get('name')))}</p>")
    body = (head + chart + table(
        ["strategy", "peak MiB", "needed MiB", "device MiB", "fits", "headroom MiB", "max batch",
         "weights+optimizer rule MiB", "peak in"], body_rows,
        numeric=[False, True, True, True, False, True, True, True, False])
        + f"<p><b>Recommendation:</b> {escape(str(plan.recommendation))}</p>"
        + '<p class="muted">Peak is the per-rank allocator peak measured on fake tensors; needed adds the stated '
          "fragmentation margin and device context.</p>")
    return [Section(id="plan", title="Memory plan", body=body)]

"""HTML report section for ``scalpel plan``: reads ``record.sections["plan"]`` (never measures)."""

from __future__ import annotations

from html import escape

from torchscalpel.record import RunRecord
from torchscalpel.report.charts import stacked_bars
from torchscalpel.report.page import Section, table
from torchscalpel.sections import PlanSection
from torchscalpel.units import fmt_bytes

_PARTS = (
    ("params", "params"),
    ("grads", "grads"),
    ("optim", "optimizer"),
    ("activations", "activations"),
    ("comm", "comm buffers"),
    ("margin", "margin"),
)


def build(record: RunRecord) -> list[Section]:
    """One "Memory plan" section (none when the record holds no plan): the recommendation first, then
    the chart and the table (every size in the same power-of-2 units as the terminal and the text)."""
    plan = record.section(PlanSection)
    if plan is None or not plan.rows:
        return []
    mib = 1024**2
    rows = [*plan.rows, *plan.alternatives]
    labels = [r["strategy"] + (" +ckpt" if r.get("checkpointing") else "") for r in rows]
    device = plan.device
    capacity = max((float(r.get("capacity") or 0) for r in rows), default=0.0) or None
    # The margin is a policy added on top of the measured peak (fragmentation, context): drawn as a
    # segment it dwarfs a small model's measured parts, so the bars show the peak's parts and the
    # table carries "needed" (peak + margin).
    chart = stacked_bars(
        "plan-memory",
        labels,
        {name: [r.get(key, 0) / mib for r in rows] for key, name in _PARTS if key != "margin"},
        unit="MiB",
        x_title="strategy",
        y_title="per-rank peak memory (MiB)",
        capacity=(capacity / mib) if capacity else None,
        capacity_label=f"device capacity {fmt_bytes(capacity)}" if capacity else "",
    )
    # .get: a plan written by an older torchscalpel (schema 1.1) may lack a column; it shows as "-"
    body_rows = [
        [
            label,
            fmt_bytes(r.get("peak")),
            fmt_bytes(r.get("margin")),
            fmt_bytes(r.get("needed")),
            fmt_bytes(r.get("capacity")),
            "-" if r.get("fits") is None else ("yes" if r["fits"] else "no"),
            fmt_bytes(r.get("headroom")),
            r.get("max_batch") if r.get("max_batch") is not None else "-",
            fmt_bytes(r.get("weights_optimizer_rule")),
            r.get("phase", ""),
        ]
        for label, r in zip(labels, rows, strict=True)
    ]
    head = (
        f"<p>{escape(str(plan.model))} · batch per rank <code>{escape(str(plan.batch))}</code> · "
        f"{escape(str(plan.optimizer))} · {escape(str(plan.precision))} · "
        f"{plan.world_size} rank(s) · device {escape(str(device.get('name')))}"
        + (f" ({escape(fmt_bytes(capacity))})" if capacity else "")
        + "</p>"
        # the script's own FSDP wrap, which the rows follow (the terminal's sentence)
        + (
            f"<p>{escape(plan.wrap_sentence[:1].upper() + plan.wrap_sentence[1:])}.</p>"
            if plan.wrap_sentence
            else ""
        )
    )
    body = (
        f"<p><b>Recommendation:</b> {escape(str(plan.recommendation))}</p>"
        + head
        + chart
        + table(
            [
                "strategy",
                "peak",
                "margin",
                "needed",
                "device",
                "fits",
                "headroom",
                "max batch",
                "weights+optimizer rule",
                "peak in",
            ],
            body_rows,
            numeric=[False, True, True, True, True, False, True, True, True, False],
        )
        + '<p class="muted">Peak is the per-rank allocator peak measured on fake tensors (the bars: its parts); '
        "needed adds the stated fragmentation margin and device context; headroom is the device capacity "
        "minus needed.</p>"
    )
    return [Section(id="plan", title="Memory plan", body=body)]

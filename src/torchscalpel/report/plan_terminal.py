"""Terminal rendering of a plan (analysis lives in planner/strategies; this only formats)."""

from __future__ import annotations

from torchscalpel.plan.planner import PlanResult, Row
from torchscalpel.sections import PlanSection
from torchscalpel.units import fmt_bytes

COLUMNS = (
    "strategy",
    "params",
    "grads",
    "optim",
    "activ.",
    "comm",
    "peak",
    "+margin",
    "needed",
    "fits",
    "headroom",
    "max batch",
    "w+opt rule",
)


def row_cells(row: Row) -> list[str]:
    """The cells of one table row, in :data:`COLUMNS` order."""
    b = row.breakdown
    return [
        b.strategy + (" +ckpt" if b.checkpointing else ""),
        fmt_bytes(b.params),
        fmt_bytes(b.grads),
        fmt_bytes(b.optim),
        fmt_bytes(b.activations),
        fmt_bytes(b.comm),
        fmt_bytes(b.peak),
        fmt_bytes(b.margin),
        fmt_bytes(b.needed),
        "yes" if b.fits else "NO",
        fmt_bytes(b.headroom),
        "-" if row.max_batch is None else str(row.max_batch),
        fmt_bytes(b.weights_optimizer_rule),
    ]


def header_lines(result: PlanResult) -> list[str]:
    """What was planned: model, batch, optimizer, precision, ranks, device."""
    r, m = result.request, result.measurement
    return [
        f"model {r.model_name}: {m.param_count / 1e6:.2f}M parameters ({fmt_bytes(m.param_bytes)}), "
        f"{len(m.blocks)} blocks (largest {fmt_bytes(max((s for _, s in m.blocks), default=0))})",
        f"batch per rank {r.batch.text()} · optimizer {r.settings.optimizer.label} · {r.settings.precision}"
        f" · grad-accum {r.settings.grad_accum} · {r.world_size} rank(s) on {r.nodes} node(s)",
        *([f"{r.batch_note}"] if r.batch_note else []),
        f"device {r.device.name}: {fmt_bytes(r.device.memory)} ({r.device.kind}; margin {r.device.margin:.0%} "
        f"+ context {fmt_bytes(r.device.context_bytes)})",
        *cpu_note(result),
        *wrap_note(result),
        f"measured on fake tensors: saved for backward {fmt_bytes(m.saved_bytes)}, "
        f"activation peak {fmt_bytes(m.act_peak_bytes)}" + _other(result),
    ]


def cpu_note(result: PlanResult) -> list[str]:
    """On a plan against host RAM (no device named, no GPU here): what that means and how to plan for a GPU."""
    if result.request.device.kind != "cpu":
        return []
    return [
        "planned against this machine's RAM (no GPU named or found): to plan for a GPU, name it with "
        "--device A100-80GB (H100-80GB, H200, L4, ...: scalpel plan -h) or give its size with --device-memory 80GiB"
    ]


def wrap_note(result: PlanResult) -> list[str]:
    """The script's own FSDP wrap (FSDP1 or FSDP2), which the rows follow: what it asked and where (the
    sentence :attr:`PlanSection.wrap_sentence` writes for the page too)."""
    sentence = PlanSection.from_dict(result.to_dict()).wrap_sentence
    return [sentence] if sentence else []


def block_lines(rows: list[list[str]]) -> list[str]:
    """The table for a narrow terminal: per strategy a heading (strategy, fits) and its figures as
    ``name value`` pairs, joined by `` · `` (the caller wraps between pairs, never inside a figure)."""
    lines = []
    for row in rows:
        cells = dict(zip(COLUMNS, row, strict=True))
        lines.append(f"{cells['strategy']}: fits {cells['fits']}")
        lines.append("  " + " · ".join(f"{name} {cells[name]}" for name in COLUMNS[1:] if name != "fits"))
    return lines


def _other(result: PlanResult) -> str:
    other = result.other_checkpointing_act_peak
    if other is None:
        return ""
    on = result.request.checkpointing == "blocks"
    return f" ({fmt_bytes(other)} {'without' if on else 'with'} block checkpointing)"


def render(result: PlanResult, width: int | None = None) -> str:
    """The plan as a plain-text table plus the recommendation. With ``width`` (the terminal's columns) and a
    table wider than that, one block per strategy instead: at 80 columns the thirteen columns (~130
    characters) were wrapped by the terminal, each row's figures landing under the wrong headers."""
    rows = [list(COLUMNS)] + [row_cells(r) for r in result.all_rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [*header_lines(result), ""]
    if width is not None and sum(widths) + 2 * (len(widths) - 1) > width:
        lines += block_lines(rows[1:])
    else:
        for k, row in enumerate(rows):
            lines.append(
                "  ".join(
                    c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )
            if k == 0:
                lines.append("  ".join("-" * w for w in widths))
    lines += [
        "",
        f"recommendation: {result.recommendation}",
        "peak = allocator peak per rank; needed = peak + margin; w+opt rule = weights+grads+optimizer only.",
    ]
    return "\n".join(lines)

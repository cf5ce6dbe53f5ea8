"""Terminal summary of ``scalpel lr`` (reads ``sections["lr"]``; never measures)."""

from __future__ import annotations

from torchscalpel.sections import LrSection

DISCARD = (
    "this was a separate run: its weights, optimizer state and any checkpoint the script wrote come from "
    "the sweep; discard them and train afresh with the suggested lr"
)


def summary_lines(lr: LrSection) -> list[str]:
    """The sweep, the suggestion, the divergence point, and the reminder that the run is thrown away."""
    n = len(lr.points)
    lines = [
        f"swept lr {lr.min_lr:.3g} -> {lr.max_lr:.3g} over {n} of {lr.steps} steps "
        f"({lr.optimizers} optimizer(s), {lr.param_groups} param group(s))"
    ]
    if lr.scheduler_steps_suspended:
        lines.append(
            f"the script's lr scheduler was suspended ({lr.scheduler_steps_suspended} step() calls had no effect)"
        )
    if lr.suggestion:
        s = lr.suggestion
        lines.append(
            f"suggested lr: {s['lr']:.3g} (steepest descent of the smoothed loss, step {s['step']}, "
            f"smoothed loss {s['smoothed']:.4g})"
        )
    else:
        lines.append(lr.note or "no suggestion")
    if lr.min_over_10:
        m = lr.min_over_10
        lines.append(
            f"minimum / 10: {m['lr']:.3g} (the smoothed minimum is at lr {m['min_lr']:.3g}; "
            "trains better on the corpus; see BENCHMARKS.md)"
        )
    if lr.divergence:
        d = lr.divergence
        smoothed = f"{d['smoothed']:.4g}" if d.get("smoothed") is not None else "not finite"
        lines.append(
            f"diverged at lr {d['lr']:.3g} (step {d['step']}: smoothed loss {smoothed} > "
            f"{lr.divergence_factor:g}x its minimum)"
        )
    elif n:
        lines.append(f"no divergence up to lr {lr.points[-1]['lr']:.3g}")
    lines.append(DISCARD)
    return lines

"""Terminal summary of ``scalpel lr`` (reads ``sections["lr"]``; never measures)."""

from __future__ import annotations

import math
from typing import Any

from torchscalpel.sections import LrSection

SEPARATE = "this was a separate run: its weights, optimizer state and any checkpoint the script wrote come from the sweep"
DISCARD = f"{SEPARATE}; discard them and train afresh with the suggested lr"
"""The reminder under a sweep that suggested an lr."""
DISCARD_UNSUGGESTED = f"{SEPARATE}; discard them (no lr was suggested)"
"""The reminder under a sweep that ran with swept lrs but suggested nothing."""


def finite_number(value: Any) -> float | None:
    """``value`` as a finite number, else None: a record is data, and a figure shown must be a number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _g(value: Any, spec: str = ".3g") -> str:
    number = finite_number(value)
    return "not recorded" if number is None else format(number, spec)


def sweep_line(lr: LrSection) -> str:
    """What was swept: the whole range, or how far a short sweep got (the lr reached, its share of the range)."""
    n = len(lr.points)
    where = f"({lr.optimizers} optimizer(s), {lr.param_groups} param group(s))"
    reached, share = finite_number(lr.reached_lr), finite_number(lr.range_share)
    if n and lr.steps is not None and n < lr.steps and reached is not None and share is not None:
        return (
            f"swept lr {_g(lr.min_lr)} -> {reached:.3g} of {_g(lr.min_lr)} -> {_g(lr.max_lr)} ({share:.0%} of the "
            f"range on a log scale) in {n} of the sweep's {lr.steps} steps {where}"
        )
    if not n:
        return f"swept no lr: none of the sweep's {lr.steps} steps ({_g(lr.min_lr)} -> {_g(lr.max_lr)}) ran"
    return f"swept lr {_g(lr.min_lr)} -> {_g(lr.max_lr)} over {n} of {lr.steps} steps {where}"


def chosen_lr(lr: LrSection) -> tuple[float, str] | None:
    """The lr to train with and which rule gave it: minimum / 10 where the sweep measured it (it trained better
    than the steepest descent on the benchmark corpus, BENCHMARKS.md), else the steepest descent; None when
    the sweep suggested nothing."""
    for part, rule in ((lr.min_over_10, "minimum / 10"), (lr.suggestion, "steepest descent")):
        if isinstance(part, dict) and (value := finite_number(part.get("lr"))) is not None and value > 0:
            return value, rule
    return None


def script_lr(lr: LrSection) -> float | None:
    """The script's own lr (its first param group's, as it set it), when the record kept it and it is positive."""
    own = [v for v in (finite_number(x) for x in lr.script_lrs) if v is not None and v > 0]
    return own[0] if own else None


def verdict_line(lr: LrSection) -> str | None:
    """Which lr to use, set against the script's own: keep it (within 2x), raise it or lower it by the ratio.
    None when the sweep suggested nothing (the lines below say why)."""
    chosen = chosen_lr(lr)
    if chosen is None:
        return None
    value, rule = chosen
    own = script_lr(lr)
    head = f"verdict: use lr {value:.3g} ({rule})"
    if own is None:
        return head + "; the script's own lr was not seen"
    ratio = value / own
    if 0.5 <= ratio <= 2:
        return f"{head}: about the script's own {own:.3g} ({ratio:.2g}x); keep it"
    if ratio > 1:
        return f"{head}: {ratio:.3g}x the script's own {own:.3g}; raise it"
    return f"{head}: 1/{1 / ratio:.3g} of the script's own {own:.3g}; lower it"


def next_line(lr: LrSection, script: str) -> str:
    """What to run after the sweep: train afresh with the chosen lr, or give the sweep what it lacked."""
    chosen = chosen_lr(lr)
    if chosen is None:
        return f"next: give the sweep its steps (above), then scalpel lr -- {script} again"
    return (
        f"next: set the script's lr to {chosen[0]:.3g} and train afresh; scalpel batch -- {script} finds the batch "
        "size and the lr rule to go with it"
    )


def render(lr: LrSection) -> list[str]:
    """The verdict (which lr, against the script's own), the sweep, the suggestions (or why they were not
    measured and how to measure them), the divergence point, and the reminder that the run is thrown away."""
    n = len(lr.points)
    said = verdict_line(lr)
    lines = [*([said] if said else []), sweep_line(lr)]
    if lr.scheduler_steps_suspended:
        lines.append(
            f"the script's lr scheduler was suspended ({lr.scheduler_steps_suspended} step() calls had no effect)"
        )
    suggestion = (
        lr.suggestion if isinstance(lr.suggestion, dict) and finite_number(lr.suggestion.get("lr")) else None
    )
    tenth = (
        lr.min_over_10
        if isinstance(lr.min_over_10, dict) and finite_number(lr.min_over_10.get("lr"))
        else None
    )
    if lr.not_measured:
        lines.append(f"suggested lr: not measured: {lr.not_measured}")
        lines.append("minimum / 10: not measured: the same reason")
        if lr.to_measure:
            lines.append(lr.to_measure)
    else:
        if suggestion is not None:
            lines.append(
                f"suggested lr: {_g(suggestion['lr'])} (steepest descent of the smoothed loss, step "
                f"{suggestion.get('step')}, smoothed loss {_g(suggestion.get('smoothed'), '.4g')})"
            )
        else:
            lines.append(lr.note or "no suggestion")
        if tenth is not None:
            lines.append(
                f"minimum / 10: {_g(tenth['lr'])} (the smoothed minimum is at lr {_g(tenth.get('min_lr'))}; "
                "trains better on the corpus; see BENCHMARKS.md)"
            )
    if isinstance(lr.divergence, dict):
        d = lr.divergence
        smoothed = (
            _g(d.get("smoothed"), ".4g") if finite_number(d.get("smoothed")) is not None else "not finite"
        )
        lines.append(
            f"diverged at lr {_g(d.get('lr'))} (step {d.get('step')}: smoothed loss {smoothed} > "
            f"{_g(lr.divergence_factor, 'g')}x its minimum)"
        )
    elif n:
        last = lr.points[-1]
        lines.append(f"no divergence up to lr {_g(last.get('lr') if isinstance(last, dict) else None)}")
    if suggestion is not None or tenth is not None:
        lines.append(DISCARD)
    elif n:
        lines.append(DISCARD_UNSUGGESTED)
    return lines

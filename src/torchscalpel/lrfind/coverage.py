"""How much of its range a sweep measured, and what a suggestion needs: pure, free of torch and of the runtime.

A range test's suggestion is read off the curve of the whole sweep. A sweep that neither reached its last
learning rate nor diverged measured only the start of that curve: the steepest descent and the minimum it
shows are those of a piece, not of the range (pytorch/examples mnist for one epoch, 40 steps, reached 1.4e-4
of 1e-7 -> 10 and "suggested" 5e-6 where the whole sweep finds 0.6). Such a sweep gives no suggestion; it says
how far it got and how to give it the steps it needs.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

_STEP_FLAG = re.compile(r"epoch|step|iter|batches")
"""Option strings of a script's argparse arguments that set how long it trains (``--epochs``, ``--max_iters``)."""
_NOT_LENGTH = re.compile(
    r"eval|log|warmup|save|interval|accum|print|decay|ckpt|checkpoint|val|test|size|every"
)
"""Words of options that mention steps but do not make training longer (``--eval_iters``, ``--warmup_steps``)."""


def log_share(lr: float, min_lr: float, max_lr: float) -> float:
    """Where ``lr`` lies in ``min_lr -> max_lr`` on a log scale: 0 at ``min_lr``, 1 at ``max_lr``."""
    if not (0 < min_lr < max_lr) or not lr > 0:
        raise ValueError("log_share needs 0 < min_lr < max_lr and a positive lr")
    return math.log(lr / min_lr) / math.log(max_lr / min_lr)


@dataclass(frozen=True, kw_only=True, slots=True)
class Coverage:
    """What one sweep measured: its points against the steps it needed, the lr it reached, whether it diverged."""

    steps_run: int
    """Points of the sweep (one per optimizer step the script ran with a swept lr)."""
    steps: int
    """Points the sweep needs to reach ``max_lr`` (``--steps``)."""
    min_lr: float
    max_lr: float
    reached_lr: float | None
    """The last lr swept; None when no point was."""
    diverged: bool

    @property
    def share(self) -> float:
        """The share of the range swept, on a log scale (0 when no point was)."""
        if self.reached_lr is None:
            return 0.0
        return min(1.0, max(0.0, log_share(self.reached_lr, self.min_lr, self.max_lr)))

    @property
    def covered(self) -> bool:
        """True when the sweep ran every step it needed (it reached ``max_lr``)."""
        return self.steps_run >= self.steps

    @property
    def measured(self) -> bool:
        """True when the curve holds what a suggestion is read from: the whole range, or up to the divergence."""
        return self.covered or self.diverged


def coverage(lrs: Sequence[float], *, min_lr: float, max_lr: float, steps: int, diverged: bool) -> Coverage:
    """The :class:`Coverage` of a sweep whose points ran at ``lrs`` (in order)."""
    return Coverage(
        steps_run=len(lrs),
        steps=steps,
        min_lr=min_lr,
        max_lr=max_lr,
        reached_lr=lrs[-1] if lrs else None,
        diverged=diverged,
    )


def short_reason(cov: Coverage, ended: str) -> str:
    """Why a sweep that neither covered its range nor diverged gives no suggestion (``ended``: how the script
    ended, e.g. ``"the script ended"``), with how far it got. Only for a sweep with at least one point."""
    if cov.measured or cov.reached_lr is None:
        raise ValueError(
            "short_reason is for a sweep with points that neither covered its range nor diverged"
        )
    return (
        f"{ended} after {cov.steps_run} of the sweep's {cov.steps} steps, at lr {cov.reached_lr:.3g} "
        f"({cov.share:.0%} of the {cov.min_lr:.3g} -> {cov.max_lr:.3g} range on a log scale), and the loss had "
        "not diverged"
    )


def more_steps_advice(cov: Coverage, flags: Sequence[str], *, min_steps: int) -> str:
    """How to give the sweep the steps it needs: the script's own arguments that make it train longer
    (``flags``, from :func:`step_flags`), or ``--steps`` of scalpel lr set to the steps the script ran (when
    that is at least ``min_steps``, the fewest a sweep may have)."""
    longer = (
        f"run the script longer (its {', '.join(flags)} argument{'s' if len(flags) > 1 else ''})"
        if flags
        else "run the script longer (more epochs or batches)"
    )
    ways = [f"{longer} so that it makes at least {cov.steps} optimizer steps"]
    if cov.steps_run >= min_steps:
        ways.append(
            f"sweep the same range in the steps it runs: scalpel lr --steps {cov.steps_run} (coarser: "
            f"{cov.steps_run} points instead of {cov.steps})"
        )
    return "to measure: " + "; or ".join(ways)


def step_flags(source: str) -> list[str]:
    """The option strings of the script's ``add_argument`` calls that set how long it trains (``--epochs``,
    ``--max_iters``, ``--train-batches``), in the order they appear; [] when the source does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        options = [o for o in options if o.startswith("-")]
        if not options:
            continue
        name = max(options, key=len)  # `-e`, `--epochs` name one argument: say its long form
        if _STEP_FLAG.search(name.lower()) and not _NOT_LENGTH.search(name.lower()):
            found.append((node.lineno, name))
    return list(dict.fromkeys(name for _, name in sorted(found)))

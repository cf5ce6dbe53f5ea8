"""``scalpel fix --verify`` for tune edits: original and patched copies timed in turn under plain python.

Each pair is two fresh processes, the original copy then the patched one, each run as
``python steptimer.py ... SCRIPT ARGS`` (:mod:`torchscalpel.fix.steptimer`: no scalpel hooks, one
global optimizer-step hook reading the clock); a run's figure is the median of its measured step
intervals. The pairs go through :func:`torchscalpel.tune.speedup.speedup_of`, tune's one speedup
definition, and the result is judged against tune's confirmed ratio and spread
(:func:`torchscalpel.fix.judge.judge`). Each run starts from the copy as it was made (what the run
before it wrote is removed first: :class:`torchscalpel.fix.verify_tree.Tree`), and keeps its first
steps' losses for the comparison of :mod:`torchscalpel.fix.verify_losses`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from torchscalpel.console import Phase
from torchscalpel.fix.judge import Judgement, judge
from torchscalpel.fix.verify_tree import Tree
from torchscalpel.tune.speedup import Speedup, speedup_of

STEPTIMER = Path(__file__).with_name("steptimer.py")
WARMUP_STEPS = 3
"""Steps left out of each run's median: the first ones pay for allocation, caches and compilation."""


@dataclass(slots=True)
class PlainRun:
    """One plain-python run under the step timer."""

    ms: float | None
    """Median step time (None: no step measured)."""
    losses: list[float | None] = field(default_factory=list)
    """The first steps' losses (:mod:`torchscalpel.fix.steptimer`)."""
    why: str = ""
    """Why no step was measured ("" when one was)."""


def plain_run(tree: Tree, script: str, args: list[str], out: Path, steps: int, timeout_s: float) -> PlainRun:
    """One plain-python run of ``script`` in ``tree`` (reset to the copy as made afterwards): its median
    step time, its first losses, and why it measured nothing."""
    cmd = [sys.executable, str(STEPTIMER), str(out), str(WARMUP_STEPS), str(steps), script, *args]
    log = out.with_suffix(".log")
    try:
        with log.open("w", encoding="utf-8") as sink:
            try:
                rc = subprocess.run(
                    cmd, cwd=tree.path, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
                ).returncode
            except subprocess.TimeoutExpired:
                return PlainRun(None, why=f"still running after {timeout_s:.0f} s ({log})")
        try:
            data = json.loads(out.read_text(encoding="utf-8"))
            times = [float(t) for t in data["step_ms"]]
            losses = [None if v is None else float(v) for v in data.get("losses") or []]
        except (OSError, ValueError, KeyError, TypeError):
            return PlainRun(None, why=f"exited {rc} without timing a step ({log})")
        if not times:
            why = f"exited {rc} after fewer than {WARMUP_STEPS + 2} optimizer steps ({log})"
            return PlainRun(None, losses, why)
        return PlainRun(statistics.median(times), losses)
    finally:
        tree.reset()  # the next run starts as this one did, not from what it wrote


def measure_pairs(
    script: str,
    args: list[str],
    original: Tree,
    patched: Tree,
    work: Path,
    pairs: int,
    steps: int,
    timeout_s: float,
) -> tuple[list[list[float]], list[PlainRun], list[PlainRun], list[str]]:
    """``pairs`` interleaved (original ms, patched ms) pairs, every original and patched run, and a
    note for each run that measured nothing."""
    out: list[list[float]] = []
    notes: list[str] = []
    runs_b: list[PlainRun] = []
    runs_c: list[PlainRun] = []
    for k in range(pairs):  # original then patched, each a fresh process: drift hits both alike
        with Phase("verify", f"timing pair {k + 1} of {pairs}: original") as phase:
            base = plain_run(original, script, args, work / f"original-{k}.json", steps, timeout_s)
            phase.outcome = f"{base.ms:.1f} ms/step" if base.ms else "no step timed"
        with Phase("verify", f"timing pair {k + 1} of {pairs}: patched") as phase:
            cand = plain_run(patched, script, args, work / f"patched-{k}.json", steps, timeout_s)
            phase.outcome = f"{cand.ms:.1f} ms/step" if cand.ms else "no step timed"
        runs_b.append(base)
        runs_c.append(cand)
        notes += [f"original run {k + 1}: {base.why}"] if base.why else []
        notes += [f"patched run {k + 1}: {cand.why}"] if cand.why else []
        if base.ms and cand.ms:
            out.append([base.ms, cand.ms])
    return out, runs_b, runs_c, notes


def verify_tune(
    tune_winner: object | None,
    script: str,
    args: list[str],
    original: Tree,
    patched: Tree,
    work: Path,
    pairs: int,
    steps: int,
    timeout_s: float,
) -> tuple[Speedup, Speedup | None, Judgement, list[str], tuple[list[PlainRun], list[PlainRun]]]:
    """Measure the pairs and judge them: (patched vs original, tune's confirmed, the verdict, notes,
    and the original and patched runs, whose losses the verification compares)."""
    measured, runs_b, runs_c, notes = measure_pairs(
        script, args, original, patched, work, pairs, steps, timeout_s
    )
    patched_speedup = speedup_of({"confirm_pairs": measured})
    tune_speedup = speedup_of(tune_winner) if tune_winner else None
    return patched_speedup, tune_speedup, judge(patched_speedup, tune_speedup), notes, (runs_b, runs_c)

"""``scalpel fix --verify`` for tune edits: original and patched copies timed in turn under plain python.

Each pair is two fresh processes, the original copy then the patched one, each run as
``python steptimer.py ... SCRIPT ARGS`` (:mod:`torchscalpel.fix.steptimer`: no scalpel hooks, one
global optimizer-step hook reading the clock); a run's figure is the median of its measured step
intervals. The pairs go through :func:`torchscalpel.tune.speedup.speedup_of`, tune's one speedup
definition, and the result is judged against tune's confirmed ratio and spread
(:func:`torchscalpel.fix.judge.judge`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from torchscalpel.fix.judge import Judgement, judge
from torchscalpel.tune.speedup import Speedup, speedup_of

STEPTIMER = Path(__file__).with_name("steptimer.py")
WARMUP_STEPS = 3
"""Steps left out of each run's median: the first ones pay for allocation, caches and compilation."""


def plain_step_ms(
    script: str, args: list[str], cwd: Path, out: Path, steps: int, timeout_s: float
) -> tuple[float | None, str]:
    """One plain-python run of ``script`` in ``cwd``: its median step time in ms (None when it measured
    no step), and why not."""
    cmd = [sys.executable, str(STEPTIMER), str(out), str(WARMUP_STEPS), str(steps), script, *args]
    log = out.with_suffix(".log")
    with log.open("w", encoding="utf-8") as sink:
        try:
            rc = subprocess.run(
                cmd, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            return None, f"still running after {timeout_s:.0f} s ({log})"
    try:
        times = [float(t) for t in json.loads(out.read_text(encoding="utf-8"))["step_ms"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"exited {rc} without timing a step ({log})"
    if not times:
        return None, f"exited {rc} after fewer than {WARMUP_STEPS + 2} optimizer steps ({log})"
    return statistics.median(times), ""


def measure_pairs(
    script: str,
    args: list[str],
    original: Path,
    patched: Path,
    work: Path,
    pairs: int,
    steps: int,
    timeout_s: float,
) -> tuple[list[list[float]], list[str]]:
    """``pairs`` interleaved (original ms, patched ms) pairs, and a note for each run that measured nothing."""
    out: list[list[float]] = []
    notes: list[str] = []
    for k in range(pairs):  # original then patched, each a fresh process: drift hits both alike
        base, why_b = plain_step_ms(script, args, original, work / f"original-{k}.json", steps, timeout_s)
        cand, why_c = plain_step_ms(script, args, patched, work / f"patched-{k}.json", steps, timeout_s)
        notes += [f"original run {k + 1}: {why_b}"] if why_b else []
        notes += [f"patched run {k + 1}: {why_c}"] if why_c else []
        if base and cand:
            out.append([base, cand])
    return out, notes


def verify_tune(
    tune_winner: object | None,
    script: str,
    args: list[str],
    original: Path,
    patched: Path,
    work: Path,
    pairs: int,
    steps: int,
    timeout_s: float,
) -> tuple[Speedup, Speedup | None, Judgement, list[str]]:
    """Measure the pairs and judge them: (patched vs original, tune's confirmed, the verdict, notes)."""
    measured, notes = measure_pairs(script, args, original, patched, work, pairs, steps, timeout_s)
    patched_speedup = speedup_of({"confirm_pairs": measured})
    tune_speedup = speedup_of(tune_winner) if tune_winner else None
    return patched_speedup, tune_speedup, judge(patched_speedup, tune_speedup), notes

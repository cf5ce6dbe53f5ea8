"""Overhead of `scalpel profile` timeline mode on the bundled examples, against the plain script.

Both variants are timed the same way, from outside, without touching the script: each example
prints its loss every step (``--log-every 1``, stdout unbuffered), and this harness stamps each
line as it arrives. The median interval between lines is the steady-state step time (start-up
and the first steps are skipped). Plain and profiled runs alternate, several rounds, with one
thread each, and the medians over all rounds are compared, so a noisy neighbour hits both alike.
Timeline mode means ``--profile-steps 0``; the profiler window's own cost is reported separately
(steps inside the window vs outside it, from one profiled run's record).

    python benchmarks/overhead.py [--rounds 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# (script and args, steps per run, lines to skip as warm-up)
EXAMPLES = {
    "char_transformer": (["examples/char_transformer.py", "--log-every", "1", "--steps", "70"], 10),
    "digits_cnn": (["examples/digits_cnn.py", "--log-every", "1", "--epochs", "40", "--steps", "400"], 40),
    # Closure-driven steps: forward and backward run inside optimizer.step (LBFGS, Lightning).
    "closure_mlp": (["benchmarks/scripts/closure_mlp.py", "--steps", "300"], 30),
    "lightning_mlp": (["benchmarks/scripts/lightning_mlp.py", "--steps", "300"], 30),
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src")
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # pinned: 2 shared cores make multi-threaded timings meaningless
    return env


def step_intervals(cmd: list[str], skip: int) -> list[float]:
    """Milliseconds between consecutive 'loss' lines of one run, after ``skip`` lines."""
    stamps: list[float] = []
    with subprocess.Popen(
        cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "loss" in line:
                stamps.append(time.perf_counter())
    if proc.returncode:
        raise RuntimeError(f"{cmd} exited with {proc.returncode}")
    stamps = stamps[skip:]
    return [1000.0 * (b - a) for a, b in itertools.pairwise(stamps)]


def _profile_cmd(script: list[str], out: Path, profile_steps: int, steps: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torchscalpel",
        "profile",
        "--out",
        str(out),
        "--warmup",
        "0",
        "--steps",
        steps,
        "--profile-steps",
        str(profile_steps),
        "--no-report",
        "--",
        *script,
    ]


def measure(name: str, rounds: int) -> dict[str, object]:
    """Median step ms for plain and profiled runs of one example, plus the profiler window's cost."""
    script, skip = EXAMPLES[name]
    samples: dict[str, list[float]] = {"plain": [], "scalpel": []}
    per_round: dict[str, list[float]] = {"plain": [], "scalpel": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for variant in ("plain", "scalpel") if r % 2 == 0 else ("scalpel", "plain"):
                cmd = (
                    [sys.executable, *script]
                    if variant == "plain"
                    else _profile_cmd(script, Path(tmp) / f"r{r}", 0, "all")
                )
                got = step_intervals(cmd, skip)
                samples[variant] += got
                per_round[variant].append(statistics.median(got))
        out = Path(tmp) / "window"
        subprocess.run(
            _profile_cmd(script, out, 5, "30"),
            cwd=REPO,
            env=_env(),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        record = json.loads((out / "run.json").read_text())
    steps = [s for s in record["steps"] if not s["warmup"] and s["index"] >= 2]
    inside = statistics.median(s["total_ms"] for s in steps if s["profiled"])
    outside = statistics.median(s["total_ms"] for s in steps if not s["profiled"])
    plain, scalpel = statistics.median(samples["plain"]), statistics.median(samples["scalpel"])
    return {
        "example": name,
        "plain_step_ms": plain,
        "scalpel_step_ms": scalpel,
        "overhead": scalpel / plain - 1.0,
        "round_medians": per_round,
        "intervals": {k: len(v) for k, v in samples.items()},
        "window_step_ms": inside,
        "unprofiled_step_ms": outside,
        "window_slowdown": inside / outside,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--examples", default=",".join(EXAMPLES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [measure(name, args.rounds) for name in args.examples.split(",")]
    print(
        "| example | plain ms/step | under `scalpel profile` ms/step | overhead | steps in profiler window vs outside |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['example']} | {r['plain_step_ms']:.2f} | {r['scalpel_step_ms']:.2f} | {100 * r['overhead']:+.1f}% "
            f"| {r['window_slowdown']:.2f}x ({r['window_step_ms']:.1f} vs {r['unprofiled_step_ms']:.1f} ms) |"
        )
    for r in results:
        print(
            f"{r['example']}: per-round medians {json.dumps(r['round_medians'])}, intervals {r['intervals']}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

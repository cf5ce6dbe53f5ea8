"""Overhead of `scalpel profile` timeline mode on the bundled examples, against the plain script.

Per-step time is measured the same way for both, from outside: wall time of a whole run with
N2 steps minus one with N1 steps, divided by N2 - N1, which cancels start-up (imports, data
set-up). Variants are interleaved (plain, profiled, plain, ...) and the median of the repeats
is compared, so a noisy neighbour hits both alike. Timeline mode means --profile-steps 0; the
profiler window's own cost is measured separately (steps inside it vs outside, same run).

    python benchmarks/overhead.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "char_transformer": (["examples/char_transformer.py", "--log-every", "1000"], "--steps", (15, 45)),
    "digits_cnn": (["examples/digits_cnn.py", "--epochs", "100"], "--steps", (60, 360)),
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src")
    env["OMP_NUM_THREADS"] = "1"  # pinned: 2 shared cores make multi-threaded timings meaningless
    return env


def _wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, env=_env(), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _cmd(variant: str, script_args: list[str], flag: str, steps: int, out: Path) -> list[str]:
    script = [*script_args, flag, str(steps)]
    if variant == "plain":
        return [sys.executable, *script]
    return [sys.executable, "-m", "torchscalpel", "profile", "--out", str(out), "--warmup", "0", "--steps", "all",
            "--profile-steps", "0", "--no-report", "--", *script]


def measure(name: str, repeats: int) -> dict[str, object]:
    """Per-step ms for plain and profiled runs of one example, plus the profiler window's cost."""
    script_args, flag, (n1, n2) = EXAMPLES[name]
    per_step: dict[str, list[float]] = {"plain": [], "scalpel": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for variant in ("plain", "scalpel") if r % 2 == 0 else ("scalpel", "plain"):
                out = Path(tmp) / f"{variant}-{r}"
                t1 = _wall(_cmd(variant, script_args, flag, n1, out))
                t2 = _wall(_cmd(variant, script_args, flag, n2, out))
                per_step[variant].append(1000.0 * (t2 - t1) / (n2 - n1))
        # Profiler window cost: the same run with a 3-step window; profiled vs unprofiled steps.
        out = Path(tmp) / "window"
        cmd = [sys.executable, "-m", "torchscalpel", "profile", "--out", str(out), "--warmup", "2", "--steps", "12",
               "--profile-steps", "3", "--no-report", "--", *script_args, flag, str(n2)]
        t_window = _wall(cmd)
        record = json.loads((out / "run.json").read_text())
    steps = [s for s in record["steps"] if not s["warmup"]]
    inside = statistics.median(s["total_ms"] for s in steps if s["profiled"])
    outside = statistics.median(s["total_ms"] for s in steps if not s["profiled"])
    plain, scalpel = statistics.median(per_step["plain"]), statistics.median(per_step["scalpel"])
    return {
        "example": name,
        "plain_step_ms": plain,
        "scalpel_step_ms": scalpel,
        "overhead": scalpel / plain - 1.0,
        "repeats": per_step,
        "window_step_ms": inside,
        "unprofiled_step_ms": outside,
        "window_slowdown": inside / outside,
        "window_run_s": t_window,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--examples", default=",".join(EXAMPLES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [measure(name, args.repeats) for name in args.examples.split(",")]
    print("| example | plain ms/step | under scalpel profile ms/step | overhead | profiler-window step / plain step |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['example']} | {r['plain_step_ms']:.2f} | {r['scalpel_step_ms']:.2f} | {100 * r['overhead']:+.1f}% "
              f"| {r['window_slowdown']:.2f}x ({r['window_step_ms']:.1f} vs {r['unprofiled_step_ms']:.1f} ms) |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

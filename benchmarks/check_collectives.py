"""Cost of the hang watch and ``--check-collectives`` per step on a healthy 2-rank gloo run.

Variants, interleaved round by round in the same run (the CPU is shared):

- ``plain``: ``scalpel launch --hang-timeout 0`` (the script runs through the rank entry point,
  nothing logged: what plain torchrun costs);
- ``watch``: ``scalpel launch`` as it is by default (every collective logged, hang watch on);
- ``check``: ``scalpel launch --check-collectives`` (also compared across ranks while it runs).

Per variant: the median step time of rank 0 over steps ``--skip``.. (the script times its own
steps), then the ratio to ``plain``. Run: ``python benchmarks/check_collectives.py --rounds 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "scripts" / "collectives_train.py"
VARIANTS = {"plain": ["--hang-timeout", "0"], "watch": [], "check": ["--check-collectives"]}


def run_once(flags: list[str], steps: int, skip: int, folder: Path) -> float:
    """Median step time (ms) of one 2-rank launch."""
    times = folder / "times.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, "-m", "torchscalpel", "launch", "--nproc", "2", "--out", str(folder / "launch"), *flags,
           "--", str(SCRIPT), str(times), str(steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if not times.exists():
        raise SystemExit(f"launch failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return statistics.median(json.loads(times.read_text())[skip:]) * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--skip", type=int, default=100, help="warm-up steps left out of the median")
    args = parser.parse_args()
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            with tempfile.TemporaryDirectory() as tmp:
                results[name].append(run_once(VARIANTS[name], args.steps, args.skip, Path(tmp)))
            print(f"round {r + 1} {name:<6} {results[name][-1]:.3f} ms/step", flush=True)
    plain = statistics.median(results["plain"])
    print(f"\n{'variant':<8} {'median ms/step':>15} {'vs plain':>9}   per round")
    for name, values in results.items():
        med = statistics.median(values)
        rounds = " ".join(f"{v:.3f}" for v in values)
        print(f"{name:<8} {med:>15.3f} {med / plain:>9.3f}   {rounds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

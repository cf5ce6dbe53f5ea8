"""What the op-line pass costs: ``scalpel profile`` on examples/char_transformer.py with the pass (its own
``profiler.op_lines.seconds`` against the command's wall time, same run) and, beside it, with --no-op-lines.

    python benchmarks/op_lines_cost.py [--steps 20] [--script-steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "char_transformer.py"


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def profile(out: Path, steps: int, script_steps: int, *flags: str) -> tuple[float, dict]:
    """Run ``scalpel profile`` once; its wall time (s) and its record."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel",
        "profile",
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--no-report",
    ]
    cmd += [*flags, "--", str(SCRIPT), "--steps", str(script_steps), "--corpus-chars", "200000"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"scalpel profile failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, json.loads((out / "run.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--script-steps", type=int, default=60)
    args = parser.parse_args()
    print(f"cpu: {cpu_name()} ({os.cpu_count()} cores), load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        wall, record = profile(Path(tmp) / "with", args.steps, args.script_steps)
        lines = record["profiler"]["op_lines"]
        if "error" in lines:
            raise SystemExit(f"the op-line pass did not run: {lines['error']}")
        print(
            f"with the pass: wall {wall:.2f} s; op-line pass {lines['seconds']:.2f} s "
            f"({100 * lines['seconds'] / wall:.1f}% of the wall time), step(s) {lines['steps']}, "
            f"its step {lines['step_ms']:.1f} ms vs median step {record['summary']['median_step_ms']:.1f} ms"
        )
        print(f"findings: {[f['rule'] for f in record['findings']]}")
        print(f"top-op lines: {[(o['name'], o['site'].rsplit('/', 1)[-1]) for o in lines['ops'][:5]]}")
        wall_off, _ = profile(Path(tmp) / "without", args.steps, args.script_steps, "--no-op-lines")
        print(f"--no-op-lines: wall {wall_off:.2f} s (difference {wall - wall_off:+.2f} s)")


if __name__ == "__main__":
    main()

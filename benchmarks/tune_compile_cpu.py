"""Why torch.compile lost in `scalpel tune` on this CPU (docs/tune.md, "Compile on a CPU").

Interleaved rounds, each variant a fresh process running examples/char_transformer.py unmodified:

- ``plain eager`` / ``plain compile``: the script alone (no torchscalpel), the model compiled by a
  three-line wrapper (``model.compile()`` after construction), steps timed between optimizer steps;
- ``trial eager`` / ``trial compile``: the same under the tune runtime (``python -m
  torchscalpel.tune.trial``), the second with ``compile(model)`` applied by the knob.

Each ratio is eager / compiled within one environment and one round (load drift cancels), so the
figures say whether compile wins without torchscalpel and whether the runtime changes that.
benchmarks/tune_compile_inprocess.py takes the runtime apart in one process (root hooks only,
backward wrapper only, the whole runtime, the knob's own compile path, fixed vs fresh batches).

    OMP_NUM_THREADS=1 python benchmarks/tune_compile_cpu.py --rounds 3
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
SCRIPT = REPO / "examples" / "char_transformer.py"

PLAIN = r"""
import importlib.util, json, statistics, sys, time, torch
mode, steps, warmup, target = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
spec = importlib.util.spec_from_file_location("ct", target)
ct = importlib.util.module_from_spec(spec); spec.loader.exec_module(ct)
Base = ct.CharGPT
class Wrapped(Base):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        if mode == "compile":
            self.compile()
ct.CharGPT = Wrapped
times, last, step = [], [None], torch.optim.AdamW.step
def timed(self, *a, **k):
    out = step(self, *a, **k)
    now = time.perf_counter()
    if last[0] is not None:
        times.append((now - last[0]) * 1000)
    last[0] = now
    return out
torch.optim.AdamW.step = timed
sys.argv = ["ct", "--steps", str(steps + warmup + 1), "--log-every", "100000"]
ct.main()
print(json.dumps({"median_ms": statistics.median(times[warmup:]), "steps": times[warmup:]}))
"""


def plain(mode: str, steps: int, warmup: int, env: dict[str, str]) -> float:
    out = subprocess.run(
        [sys.executable, "-c", PLAIN, mode, str(steps), str(warmup), str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["median_ms"])


def trial(settings: dict, steps: int, warmup: int, env: dict[str, str], out: Path) -> tuple[float, dict]:
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel.tune.trial",
        "--settings",
        json.dumps(settings),
        "--out",
        str(out),
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--",
        str(SCRIPT),
        "--steps",
        "400",
        "--log-every",
        "100000",
    ]
    subprocess.run(cmd, env=env, capture_output=True, check=True)
    record = json.loads((out / "run.json").read_text())
    times = [s["total_ms"] for s in record["steps"] if not s.get("warmup") and s["total_ms"] > 0]
    return statistics.median(times), record["sections"].get("trial", {}).get("compile", {})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    env = dict(
        os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-compile-"))
    rows = []
    for r in range(args.rounds):
        row = {
            "round": r,
            "plain_eager": plain("eager", args.steps, args.warmup, env),
            "plain_compile": plain("compile", args.steps, args.warmup, env),
        }
        row["trial_eager"], _ = trial({}, args.steps, args.warmup, env, tmp / f"{r}-eager")
        row["trial_compile"], stats = trial(
            {"compile": {"target": "model"}}, args.steps, args.warmup, env, tmp / f"{r}-compile"
        )
        row["plain_ratio"] = row["plain_eager"] / row["plain_compile"]
        row["trial_ratio"] = row["trial_eager"] / row["trial_compile"]
        row["trial_recompiles"] = stats.get("recompiles")
        rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    print(
        json.dumps(
            {
                "plain_ratio_median": statistics.median(r["plain_ratio"] for r in rows),
                "trial_ratio_median": statistics.median(r["trial_ratio"] for r in rows),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

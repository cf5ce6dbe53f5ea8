"""Benchmark: where ``scalpel run --config`` and the script ``scalpel fix`` patched with the same settings
spend their wall time (BENCHMARKS.md, "tune end to end": why the two end-to-end figures differ).

Each process gets the same probe (a ``sitecustomize`` on ``PYTHONPATH``, nothing of torchscalpel in it):
the time from interpreter start to the probe, to ``import torch`` done, to the first and last
``optimizer.step()``, every step's interval, dynamo's compile seconds, graphs, recompiles and inductor's
FX-graph cache hits and misses, written as JSON when the process exits. Variants run in interleaved
rounds on the same machine:

- ``patched``: the patched copy under plain python;
- ``run``: ``python -m torchscalpel run --config TOML -- ORIGINAL ARGS``;
- ``original``: the original under plain python (the reference both are divided by);
- ``run_empty``: ``scalpel run`` with a config that sets nothing, on the original: ``scalpel run``'s own
  start-up and per-step cost, apart from what the settings do.

    OMP_NUM_THREADS=1 python benchmarks/run_vs_patched.py --toml RUN/scalpel.toml --original SCRIPT \\
        --patched PATCHED --rounds 2 -- ARGS
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]

PROBE = r"""
import atexit, json, os, time

_T0 = time.monotonic()
_OUT = os.environ.get("SCALPEL_PROBE_OUT")
_STEPS = []
# torch is imported here, before the script: every variant imports it anyway, so the cost is the same
# for all and the step hook is in place before the first optimizer is built
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

_TORCH = time.monotonic() - _T0
register_optimizer_step_post_hook(lambda *a: _STEPS.append(time.monotonic() - _T0))


def _dump():
    if not _OUT:
        return
    out = {"steps_at_s": _STEPS, "exit_s": time.monotonic() - _T0, "torch_imported": _TORCH}
    try:
        import torch._dynamo.utils as u

        times = getattr(u, "compilation_time_metrics", {}) or {}
        out["compile_s"] = round(
            sum(times.get("_compile.compile_inner", [])) + sum(times.get("backward._backward_impl", [])), 2
        )
        stats = u.counters.get("stats", {})
        out["graphs"] = int(stats.get("unique_graphs", 0))
        failures = getattr(u, "guard_failures", {}) or {}
        out["recompiles"] = sum(len(v) for v in failures.values())
        ind = u.counters.get("inductor", {})
        out["fxgraph_cache_hit"] = int(ind.get("fxgraph_cache_hit", 0))
        out["fxgraph_cache_miss"] = int(ind.get("fxgraph_cache_miss", 0))
        aot = u.counters.get("aot_autograd", {})
        out["autograd_cache_hit"] = int(aot.get("autograd_cache_hit", 0))
        out["autograd_cache_miss"] = int(aot.get("autograd_cache_miss", 0))
    except Exception as exc:  # the probe must never change the exit code
        out["error"] = repr(exc)
    with open(_OUT, "w") as f:
        json.dump(out, f)


atexit.register(_dump)
"""


def env(probe_dir: Path, out: Path, with_src: bool) -> dict[str, str]:
    path = [str(probe_dir)] + ([str(REPO / "src")] if with_src else [])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "SCALPEL_PROBE_OUT": str(out),
    }


def one(cmd: list[str], cwd: Path, probe_dir: Path, with_src: bool) -> dict[str, Any]:
    """Run ``cmd`` with the probe; its figures (None where the process failed)."""
    out = probe_dir / f"probe-{time.monotonic_ns()}.json"
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env(probe_dir, out, with_src), capture_output=True, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0 or not out.is_file():
        return {"failed": proc.returncode, "stderr": proc.stderr.decode(errors="replace")[-800:]}
    data = json.loads(out.read_text())
    steps = data.pop("steps_at_s")
    intervals = [1000.0 * (b - a) for a, b in itertools.pairwise(steps)]
    steady = intervals[len(intervals) // 2 :]
    return {
        "wall_s": round(wall, 2),
        "to_torch_s": round(data.get("torch_imported") or 0.0, 2),
        "to_first_step_s": round(steps[0], 2) if steps else None,
        "first_steps_ms": [round(v) for v in intervals[:4]],
        "steady_step_ms": round(statistics.median(steady), 1) if steady else None,
        "steps": len(steps),
        "after_last_step_s": round(data["exit_s"] - steps[-1], 2) if steps else None,
        **{k: data[k] for k in data if k not in ("torch_imported", "exit_s")},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--toml", type=Path, required=True)
    p.add_argument("--original", type=Path, required=True)
    p.add_argument("--patched", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", type=Path)
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        probe_dir = Path(tmp)
        (probe_dir / "sitecustomize.py").write_text(PROBE)
        empty = probe_dir / "empty.toml"
        empty.write_text("[tune]\n")
        variants = {
            "original": ([sys.executable, str(a.original), *args], False),
            "patched": ([sys.executable, str(a.patched), *args], False),
            "run": (
                [
                    sys.executable,
                    "-m",
                    "torchscalpel",
                    "run",
                    "--config",
                    str(a.toml),
                    "--",
                    str(a.original),
                    *args,
                ],
                True,
            ),
            "run_empty": (
                [
                    sys.executable,
                    "-m",
                    "torchscalpel",
                    "run",
                    "--config",
                    str(empty),
                    "--",
                    str(a.original),
                    *args,
                ],
                True,
            ),
        }
        for i in range(a.rounds):
            for name, (cmd, with_src) in variants.items():
                row = {"round": i, "variant": name, **one(cmd, a.original.parent, probe_dir, with_src)}
                row["load"] = round(os.getloadavg()[0], 2)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

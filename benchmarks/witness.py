"""Issue 27's figures beside their witnesses, in one run.

1. The profiler window's size budget on a time_sequence_prediction-style script (LBFGS, two unrolled
   ``LSTMCell``, float64, 20 closure evaluations per step: tests/fixtures/witness/lbfgs_lstm.py): wall time
   and peak RSS of ``scalpel profile`` with its defaults, against the plain script (``python SCRIPT``),
   with the trace size and whether run.json was written. Before the budget, the same command at 300
   timesteps grew past 14 GB and never wrote a record.
2. FLOPs per step on tests/fixtures/witness/flops_cnn.py (fp32, bf16 autocast, checkpointed, compiled with
   aot_eager): the record's ``flops_per_step`` against ``torch.utils.flop_counter.FlopCounterMode`` over one
   training step of the same model in this process.

    python benchmarks/witness.py [--timesteps 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WITNESS = REPO / "tests" / "fixtures" / "witness"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _timed(cmd: list[str]) -> tuple[int, float, float]:
    """Exit code, wall seconds and the child's peak RSS in MiB (``ru_maxrss`` of the finished child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # RUSAGE_CHILDREN keeps the largest child so far: run the bigger one second, or read the difference.
    return done.returncode, wall, max(after, before) / 1024.0


def window_budget(timesteps: int) -> dict:
    """The LBFGS fixture plain and under ``scalpel profile`` defaults (the profiled run second: see _timed)."""
    args = [str(WITNESS / "lbfgs_lstm.py"), "--timesteps", str(timesteps), "--steps", "6"]
    rc_plain, wall_plain, rss_plain = _timed([sys.executable, *args])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        rc, wall, rss = _timed(
            [sys.executable, "-m", "torchscalpel", "profile", "--out", str(out), "--no-report", "--", *args]
        )
        record = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
        trace = out / "trace.json.gz"
        events = len(json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]) if trace.exists() else 0
        size = trace.stat().st_size if trace.exists() else 0
    prof = record.get("profiler", {})
    return {
        "timesteps": timesteps,
        "plain": {"exit": rc_plain, "wall_s": wall_plain, "max_rss_mib": rss_plain},
        "profile": {
            "exit": rc,
            "wall_s": wall,
            "max_rss_mib": rss,
            "run_json": bool(record),
            "trace_events": events,
            "trace_gz_bytes": size,
            "bounded": prof.get("bounded"),
            "event_budget": prof.get("event_budget"),
            "events_per_step_estimate": prof.get("events_per_step_estimate"),
        },
    }


def _fixture():
    spec = importlib.util.spec_from_file_location("flops_cnn_witness", WITNESS / "flops_cnn.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def flops(argv: list[str]) -> dict:
    """The record's FLOPs per step against FlopCounterMode over one step of the same model."""
    witness = _fixture().counted_flops(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torchscalpel",
                "profile",
                "--out",
                str(out),
                "--warmup",
                "2",
                "--steps",
                "5",
                "--profile-steps",
                "1",
                "--no-report",
                "--",
                str(WITNESS / "flops_cnn.py"),
                *argv,
            ],
            env=_env(),
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        summary = json.loads((out / "run.json").read_text())["summary"]
    recorded = summary["flops_per_step"]
    return {
        "argv": " ".join(argv) or "(fp32)",
        "recorded": recorded,
        "flop_counter_mode": witness,
        "recompute": summary.get("recompute_flops_per_step"),
        "ratio": recorded / witness,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timesteps", type=int, default=300)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    result = {
        "cpu": platform.processor() or platform.machine(),
        "load": os.getloadavg(),
        "window": window_budget(a.timesteps),
        "flops": [flops(argv) for argv in ([], ["--amp"], ["--checkpoint"], ["--compile", "aot_eager"])],
    }
    w = result["window"]
    print(
        f"window, LBFGS fixture at {w['timesteps']} timesteps: plain {w['plain']['wall_s']:.1f} s "
        f"{w['plain']['max_rss_mib']:.0f} MiB; profile {w['profile']['wall_s']:.1f} s "
        f"{w['profile']['max_rss_mib']:.0f} MiB, {w['profile']['trace_events']} events "
        f"({w['profile']['trace_gz_bytes'] / 1e6:.1f} MB gz), run.json {w['profile']['run_json']}; "
        f"{w['profile']['bounded']}"
    )
    for row in result["flops"]:
        print(
            f"flops {row['argv']:>22}: recorded {row['recorded']:.6g}, FlopCounterMode {row['flop_counter_mode']:.6g}, "
            f"ratio {row['ratio']:.4f}, recompute {row['recompute']}"
        )
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

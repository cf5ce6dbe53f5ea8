"""Cost of the hang watch's collective log and of ``--check-collectives`` on a healthy 2-rank gloo run.

Three figures, each against its peer in the same run:

1. In the ranks (what every watched launch pays): ``scalpel launch --check-collectives`` runs
   ``benchmarks/scripts/collectives_train.py`` (7 collectives per step), whose steps alternate
   between the logged ``all_reduce`` and the unwrapped one (``__wrapped__``) in the same process:
   median step time logged / unlogged per launch, and the median over launches; the same for the
   rank's CPU time per step (all its threads), which a shared CPU's scheduling delays do not inflate.
2. In the launcher: CPU time of one poll of the check (read 2 full rank logs, compare them),
   as a share of one core at 2 polls per second.
3. Whole launches, interleaved: ``--hang-timeout 0`` (nothing logged) vs ``--check-collectives``,
   median step of rank 0 (noisy on a shared CPU; reported beside 1, which is not).

Run: ``python benchmarks/check_collectives.py --rounds 9``. The 1-minute load average is sampled at every
launch and printed with the figures (the CPU is shared: a figure means little without it).
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
SCRIPT = REPO / "benchmarks" / "scripts" / "collectives_train.py"
VARIANTS = {"plain": ["--hang-timeout", "0"], "check": ["--check-collectives"]}


def run_once(flags: list[str], steps: int, folder: Path) -> list[list[float]]:
    """Rank 0's ``[logged, seconds, cpu seconds]`` per step from one 2-rank launch."""
    times = folder / "times.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel",
        "launch",
        "--nproc",
        "2",
        "--out",
        str(folder / "launch"),
        *flags,
        "--",
        str(SCRIPT),
        str(times),
        str(steps),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if not times.exists():
        raise SystemExit(f"launch failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(times.read_text())


def poll_cost_ms(repeats: int = 200) -> float:
    """CPU ms of one check poll over two full (256-entry) rank logs."""
    sys.path.insert(0, str(REPO / "src"))
    from torchscalpel.distributed.hangdiag import first_mismatch
    from torchscalpel.distributed.hangwatch import HangWatch, WatchOptions
    from torchscalpel.runtime.collectives import SLOTS, CollectiveRecorder

    with tempfile.TemporaryDirectory() as tmp:
        for rank in (0, 1):
            rec = CollectiveRecorder(Path(tmp), rank, 2, 0)
            for i in range(SLOTS):
                rec.finish(
                    rec.enter("all_reduce", "default", [[128, 64]], ["float32"], f"/u/train.py:{i}"), ok=True
                )
        watch = HangWatch(WatchOptions(folder=Path(tmp), report_dir=Path(tmp), local_ranks=2, check=True))
        t0 = time.process_time()
        for _ in range(repeats):
            assert first_mismatch(watch.logs()) is None
        return (time.process_time() - t0) / repeats * 1000.0


PER_CALL_CHILD = """
import os, statistics, sys, tempfile, time
from pathlib import Path
import torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
plain = dist.all_reduce
from torchscalpel.runtime import collectives
collectives.install(Path(tempfile.mkdtemp()), 0, 1)
logged = dist.all_reduce
t = torch.ones(128, 64)
def block(fn, n=400):
    t0 = time.perf_counter()
    for _ in range(n):
        fn(t)
    return (time.perf_counter() - t0) / n * 1e6
diffs, base = [], []
for _ in range(25):
    a, b = block(plain), block(logged)
    diffs.append(b - a)
    base.append(a)
print(statistics.median(diffs), statistics.median(base))
"""


def per_call_us() -> tuple[float, float]:
    """Extra microseconds per logged all_reduce, and the unlogged call's own time (one-rank gloo group,
    blocks of 400 calls alternating 25 times in one process)."""
    from torchscalpel.netutil import free_port

    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PER_CALL_CHILD, str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--skip", type=int, default=100, help="warm-up steps left out of the medians")
    args = parser.parse_args()
    whole: dict[str, list[float]] = {name: [] for name in VARIANTS}
    whole_cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    ab: list[float] = []
    ab_cpu: list[float] = []
    loads: list[float] = []
    for r in range(args.rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            loads.append(os.getloadavg()[0])
            with tempfile.TemporaryDirectory() as tmp:
                rows = run_once(VARIANTS[name], args.steps, Path(tmp))[args.skip :]
            whole[name].append(statistics.median(row[1] for row in rows) * 1000.0)
            whole_cpu[name].append(statistics.median(row[2] for row in rows) * 1000.0)
            if name == "check":
                logged = statistics.median(row[1] for row in rows if row[0])
                plain = statistics.median(row[1] for row in rows if not row[0])
                ab.append(logged / plain)
                cpu_logged = statistics.median(row[2] for row in rows if row[0])
                cpu_plain = statistics.median(row[2] for row in rows if not row[0])
                ab_cpu.append(cpu_logged / cpu_plain)
                print(
                    f"round {r + 1} check  in-process logged/unlogged {logged * 1e3:.3f}/{plain * 1e3:.3f} ms "
                    f"= {ab[-1]:.3f}; CPU {cpu_logged * 1e3:.3f}/{cpu_plain * 1e3:.3f} ms = {ab_cpu[-1]:.3f}",
                    flush=True,
                )
            print(f"round {r + 1} {name:<6} {whole[name][-1]:.3f} ms/step", flush=True)
    poll = poll_cost_ms()
    extra, base = per_call_us()
    loads.append(os.getloadavg()[0])
    print(
        f"\n1. logged vs unlogged all_reduce, same process (7 collectives/step): median ratio "
        f"{statistics.median(ab):.3f} (rounds: {' '.join(f'{x:.3f}' for x in ab)})"
    )
    print(
        f"1c. the same steps' CPU time (rank 0, all threads): median ratio {statistics.median(ab_cpu):.3f} "
        f"(rounds: {' '.join(f'{x:.3f}' for x in ab_cpu)})"
    )
    print(
        f"1b. per call, one-rank group, alternating blocks: +{extra:.1f} us per logged all_reduce "
        f"(unlogged call {base:.1f} us); at 7 collectives per step: {7 * extra / 1000:.3f} ms per step"
    )
    print(f"2. launcher check: {poll:.2f} ms CPU per poll, {poll * 2 / 10:.2f}% of one core at 2 polls/s")
    plain = statistics.median(whole["plain"])
    check = statistics.median(whole["check"])
    print(
        f"3. whole launches: plain {plain:.3f} ms/step, --check-collectives {check:.3f} ms/step, ratio "
        f"{check / plain:.3f} (plain rounds {' '.join(f'{x:.2f}' for x in whole['plain'])}; check rounds "
        f"{' '.join(f'{x:.2f}' for x in whole['check'])})"
    )
    cpu_plain, cpu_check = statistics.median(whole_cpu["plain"]), statistics.median(whole_cpu["check"])
    print(
        f"3b. whole launches, CPU time per step: plain {cpu_plain:.3f} ms, --check-collectives {cpu_check:.3f} ms, "
        f"ratio {cpu_check / cpu_plain:.3f}"
    )
    print(
        f"load average (1 min) during the run: {min(loads):.2f}-{max(loads):.2f}, median {statistics.median(loads):.2f}; "
        f"CPU: {_cpu_model()}"
    )
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())

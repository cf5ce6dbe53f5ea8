"""`scalpel plan` on an FSDP1 script (FullyShardedDataParallel, the tutorial's shape) against its fully_shard twin,
and the twin's step measured for real on 2 gloo ranks.

Both scripts (tests/fixtures/plan/fsdp1_mnist.py, fsdp2_mnist.py) are planned through the CLI as `scalpel launch
--plan` plans them (a one-rank world, `--world-size 2`): the FSDP1 one cannot run on CPU as written, the plan
records its wrap and plans the strategy it names. The figures expected: the same row for both. Beside them, the
twin's training step (the tutorial's Net, Adadelta, per-rank batch 64) run for real under FSDP2 on 2 gloo ranks,
its allocator peak per rank read as benchmarks/plan_accuracy.py reads it (plan_measure.profiled_memory).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/plan_fsdp1.py [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_measure import profiled_memory, train_steps, wrap_for
from torchscalpel.blocks import find_blocks
from torchscalpel.netutil import free_port
from torchscalpel.plan.simulate import OptimizerSpec, SimSettings
from torchscalpel.plan.spec import parse_batch_spec

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "plan"
BATCH = "x=float32[64,1,28,28],y=int64[64]:10"
MIB = 2**20


def plan(script: str, *script_args: str) -> dict:
    """The plan section of ``scalpel plan --world-size 2 -- SCRIPT ARGS`` in a one-rank world."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        env = {
            **os.environ,
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
        cmd = [sys.executable, "-m", "torchscalpel", "plan", "--world-size", "2", "--no-max-batch"]
        cmd += ["--device-memory", "16GiB", "--out", tmp, "--json", str(out), "--", str(FIXTURES / script)]
        proc = subprocess.run([*cmd, *script_args], env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{script}: scalpel plan failed:\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def _net():
    spec = importlib.util.spec_from_file_location("fsdp2_mnist", FIXTURES / "fsdp2_mnist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the fixture's training runs only as __main__
    return module.Net


def _worker(rank: int, port: int, out: str, strategy: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    net = _net()
    settings = SimSettings(optimizer=OptimizerSpec(cls="torch.optim.Adadelta", kwargs={"lr": 1.0}))
    reading = profiled_memory(
        lambda: train_steps(net(), parse_batch_spec(BATCH), settings, wrap=wrap_for(strategy, find_blocks))
    )
    Path(f"{out}.{rank}").write_text(json.dumps([reading.peak, reading.counter_peak]))
    dist.barrier()
    dist.destroy_process_group()


def measured(strategy: str) -> list[list[int]]:
    """Each rank's [repaired peak, raw counter peak] of the twin's step under ``strategy`` (one retry)."""
    for _ in range(2):
        out = tempfile.mktemp(prefix="plan-fsdp1-")
        try:
            mp.spawn(_worker, args=(free_port(), out, strategy), nprocs=2)
        except Exception as exc:  # judge by what the ranks wrote (gloo's exit abort)
            print(f"note: spawn ended with {type(exc).__name__}", file=sys.stderr)
        files = [Path(f"{out}.{r}") for r in range(2)]
        if all(f.exists() for f in files):
            values = [json.loads(f.read_text()) for f in files]
            for f in files:
                f.unlink()
            return values
    raise SystemExit(f"{strategy}: the ranks did not report")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for sharding, strategy in (("FULL_SHARD", "fsdp-full"), ("SHARD_GRAD_OP", "fsdp-grad-op")):
        one = plan("fsdp1_mnist.py", "--sharding", sharding)
        two = plan("fsdp2_mnist.py", "--sharding", sharding)
        (r1,), (r2,) = one["rows"], two["rows"]
        peaks = measured(strategy)
        real = max(p[0] for p in peaks)
        rows.append(
            {
                "sharding": sharding,
                "fsdp1_row": r1,
                "fully_shard_row": r2,
                "same_row": all(
                    r1[k] == r2[k] for k in ("strategy", "params", "grads", "optim", "comm", "peak")
                ),
                "measured_per_rank": peaks,
                "plan_error": (r1["peak"] - real) / real,
            }
        )
        print(
            f"{sharding:<13} FSDP1 plan {r1['strategy']} {r1['peak'] / MIB:.2f} MiB · fully_shard twin plan "
            f"{r2['strategy']} {r2['peak'] / MIB:.2f} MiB · twin measured (2 gloo ranks, max) {real / MIB:.2f} MiB "
            f"· plan error {rows[-1]['plan_error']:+.1%}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

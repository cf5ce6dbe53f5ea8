"""Resume-exactness soak: SIGKILL a 2-rank run at a random step, relaunch, compare bit for bit.

Each trial picks DDP or FSDP2, a kill step and a rank at random; the killed run is relaunched with
the same command and must log the same loss at every step (float hex) and end with a final
model, optimizer, LR scheduler and GradScaler state that is ``torch.equal`` to an uninterrupted
run. The training uses dropout, a shuffled DistributedSampler and 2 loader workers per rank with
a random per-sample augmentation.

    python benchmarks/resume_soak.py --trials 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "ddp_fsdp_transformer.py"
ABORT = "terminate called without an active exception"
TRAIN = ["--steps", "16", "--save-every", "3", "--workers", "2", "--scaler", "--windows", "192"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def launch(cwd: Path, *script_args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel",
        "launch",
        "--nproc",
        "2",
        "--out",
        str(cwd / "launch"),
        "--",
        str(EXAMPLE),
        *TRAIN,
        "--ckpt",
        "ckpt",
        "--log",
        "logs",
        "--final",
        "final.pt",
        *script_args,
    ]
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0 and ABORT in proc.stdout + proc.stderr and (cwd / "final.pt").exists():
        return subprocess.CompletedProcess(
            cmd, 0, proc.stdout, proc.stderr
        )  # exit-time gloo abort, work done
    return proc


def losses(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(folder.glob("losses-rank*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out[f"{path.stem}:{row['step']}"] = row["loss"]
    return out


def differences(a, b, path: str = "state") -> list[str]:
    if isinstance(a, torch.Tensor):
        return [] if torch.equal(a, b) else [path]
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return [f"{path} keys"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list | tuple):
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [path]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        refs = {}
        for strategy in ("ddp", "fsdp"):
            ref = root / f"ref-{strategy}"
            ref.mkdir()
            proc = launch(ref, "--strategy", strategy)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            refs[strategy] = (losses(ref / "logs"), torch.load(ref / "final.pt", weights_only=True))
        for trial in range(args.trials):
            strategy = rng.choice(["ddp", "fsdp"])
            die_at, die_rank = rng.randint(1, 15), rng.randint(0, 1)
            cwd = root / f"trial-{trial}"
            cwd.mkdir()
            killed = launch(cwd, "--strategy", strategy, "--die-at", str(die_at), "--die-rank", str(die_rank))
            resumed = launch(cwd, "--strategy", strategy)
            ok = killed.returncode != 0 and resumed.returncode == 0
            problems = (
                []
                if ok
                else [f"exit codes {killed.returncode}/{resumed.returncode}: {resumed.stderr[-500:]}"]
            )
            if ok:
                ref_losses, ref_state = refs[strategy]
                got = losses(cwd / "logs")
                problems += [f"loss {k}" for k in ref_losses if got.get(k) != ref_losses[k]]
                problems += differences(ref_state, torch.load(cwd / "final.pt", weights_only=True))
            resumed_from = [
                ln for ln in resumed.stderr.splitlines() + resumed.stdout.splitlines() if "resumed from" in ln
            ]
            row = {
                "trial": trial,
                "strategy": strategy,
                "die_at": die_at,
                "die_rank": die_rank,
                "resumed": resumed_from[0].split("(")[-1].rstrip(")") if resumed_from else "start",
                "exact": not problems,
                "problems": problems[:5],
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    exact = sum(r["exact"] for r in results)
    summary = {"trials": len(results), "exact": exact, "wall_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps(summary))
    return 0 if exact == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

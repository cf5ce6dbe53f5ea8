"""Kill-during-save soak: SIGKILL a process that saves checkpoints back to back, at random moments.

Claim: ``latest`` never points at a broken checkpoint. After every kill the newest committed
checkpoint must pass the full SHA-256 check and hold exactly the weights saved at its step (each
step saves weights filled with the step number), and the next process must resume from it.

    python benchmarks/kill_during_save_soak.py --kills 200

The saver is a forked child (torch already imported), so a kill point costs ~0.2 s, not a
Python start-up. A kill lands uniformly within ~2 save durations after the child reports it is
saving, so it hits every phase: DCP writes, per-rank files, manifest, marker, rename, pruning.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from torchscalpel import distributed as sd
from torchscalpel.distributed import manifest

DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


def _model(width: int = 256) -> torch.nn.Module:
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])  # 256: ~1 MiB of weights


def _saver(root: Path, conn) -> None:
    """Child: resume from latest, then save steps latest+1, latest+2, ... until killed."""
    torch.set_num_threads(1)
    for name in DIST_ENV:
        os.environ.pop(name, None)
    sd.setup(seed=0, log_level=logging.WARNING)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = sd.Checkpointer(root, model=model, optimizer=opt, keep=2, sigterm=False)
    step = ckpt.load() or 0
    conn.send_bytes(b"r")
    while True:
        step += 1
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(step))
        ckpt.save(step)
        conn.send_bytes(b"s")


def _phase(root: Path) -> str:
    """What the kill interrupted, read from what is on disk."""
    tmps = sorted(root.glob(".tmp-step-*"))
    if sorted(root.glob(".del-step-*")):
        return "pruning"
    if not tmps:
        return "between saves"
    t = tmps[-1]
    if (t / manifest.COMMIT).exists():
        return "after commit marker, before rename"
    if (t / manifest.MANIFEST).exists():
        return "after manifest, before marker"
    if (t / "shared.json").exists():
        return "after all files, before manifest"
    return "writing files"


def verify(root: Path) -> tuple[int | None, str | None]:
    """(step of latest, problem or None): latest must verify fully and hold its own step's weights."""
    folder = manifest.latest(root)
    if folder is None:
        return None, None
    problem = manifest.check(folder, full=True)
    if problem is not None:
        return None, f"latest {folder.name} is broken: {problem.message}"
    step = int(folder.name.split("-")[1])
    meta = json.loads((folder / "shared.json").read_text())
    if int(meta["step"]) != step:
        return step, f"{folder.name} says step {meta['step']}"
    reference = _model().state_dict()
    state = {f"model.{k}": torch.empty_like(v) for k, v in reference.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(folder)), no_dist=True)
    if not all(bool((t == float(step)).all()) for t in state.values()):
        return step, f"{folder.name} does not hold the weights of step {step}"
    return step, None


def run_trials(kills: int, seed: int, root: Path) -> dict[str, object]:
    """Run ``kills`` kill points against one checkpoint folder; return counts and any problems."""
    rng = random.Random(seed)
    phases: dict[str, int] = {}
    problems: list[str] = []
    save_s = 0.05
    last_step = 0
    resumed_from: list[int] = []
    timings: dict[str, list[float]] = {}
    # Children come from a forkserver: a plain fork of a process whose OpenMP pool or gloo
    # threads are running (pytest after other tests) can deadlock in the child.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchscalpel.distributed"])
    for _ in range(kills):
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_saver, args=(root, child_conn), daemon=True)
        t_start = time.perf_counter()
        proc.start()
        child_conn.close()
        if not parent_conn.poll(120) or parent_conn.recv_bytes() != b"r":
            proc.kill()
            problems.append(f"saver did not start (exit code {proc.exitcode})")
            break
        timings.setdefault("start_s", []).append(time.perf_counter() - t_start)
        resumed_from.append(last_step)
        t0 = time.perf_counter()
        # Measure one save to aim the kill, then kill within ~2 save durations.
        if parent_conn.poll(120):
            parent_conn.recv_bytes()
        save_s = 0.8 * save_s + 0.2 * (time.perf_counter() - t0)
        time.sleep(rng.uniform(0, 2 * save_s))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        parent_conn.close()
        phase = _phase(root)
        phases[phase] = phases.get(phase, 0) + 1
        t_verify = time.perf_counter()
        step, problem = verify(root)
        timings.setdefault("verify_s", []).append(time.perf_counter() - t_verify)
        if problem:
            problems.append(problem)
        if step is not None and step < last_step:
            problems.append(f"latest went back from step {last_step} to {step}")
        last_step = step or last_step
    return {
        "kills": kills,
        "problems": problems,
        "phases": phases,
        "final_step": last_step,
        "mean_save_ms": round(save_s * 1000, 1),
        **{f"mean_{k}": round(sum(v) / len(v), 3) for k, v in timings.items()},
    }


def measure_overhead(root: Path, n: int, width: int = 256) -> dict[str, float]:
    """Median save time of Checkpointer.save vs a plain ``dcp.save`` of the same state, interleaved.

    The plain save is the peer: the same DCP files (fsynced by DCP's writer), without the
    per-rank RNG/loader files, manifest hashing, commit marker, renames and directory fsyncs.
    """
    import statistics

    for name in DIST_ENV:
        os.environ.pop(name, None)
    sd.setup(seed=0, log_level=logging.WARNING)
    model = _model(width)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, width)).sum().backward()
    opt.step()  # optimizer state exists, as in training
    ckpt = sd.Checkpointer(root / "ours", model=model, optimizer=opt, keep=2, sigterm=False)
    ours, plain = [], []
    for i in range(n):
        t0 = time.perf_counter()
        ckpt.save(i)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dcp.save(ckpt._dcp_state(), storage_writer=dcp.FileSystemWriter(str(root / "plain" / str(i))))
        plain.append(time.perf_counter() - t0)
    sd.teardown()
    a, b = statistics.median(ours), statistics.median(plain)
    mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    return {
        "saves": n,
        "weights_mib": round(mib, 1),
        "checkpointer_ms": round(a * 1000, 1),
        "plain_dcp_ms": round(b * 1000, 1),
        "ratio": round(a / b, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, help="checkpoint folder (default: a temporary one)")
    parser.add_argument(
        "--overhead",
        type=int,
        default=0,
        metavar="N",
        help="only measure N interleaved saves: Checkpointer vs plain dcp.save",
    )
    parser.add_argument(
        "--width", type=int, default=256, help="with --overhead: 4 Linear(width, width) layers"
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    if args.overhead:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure_overhead(Path(tmp), args.overhead, args.width), indent=1))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = args.dir or Path(tmp) / "ckpt"
        t0 = time.perf_counter()
        result = run_trials(args.kills, args.seed, root)
        result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())

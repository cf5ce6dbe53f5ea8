"""Child-process side of the probes that must not run in ``scalpel``'s own process.

``python -m torchscalpel.envcheck.probe_worker compile --device cpu --backend inductor`` compiles a
tiny function once; ``... allreduce --backend gloo`` is one rank of an all_reduce (rank, world size
and the rendezvous come from the environment, as torchrun would set them). Each prints exactly one
JSON line starting with ``PROBE-RESULT `` and exits; the parent judges by that line, because a
gloo rank can abort at interpreter exit after finishing its work (see DESIGN.md, Testing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

MARKER = "PROBE-RESULT "


def _emit(data: dict[str, Any]) -> None:
    print(MARKER + json.dumps(data), flush=True)


def compile_once(device: str, backend: str) -> dict[str, Any]:
    """Compile ``sin(x) * 2 + x`` once, time the first call, check it against eager."""
    import torch

    def tiny(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2 + x

    x = torch.randn(64, 64, device=device)
    fn = torch.compile(tiny, backend=backend)
    start = time.perf_counter()
    out = fn(x)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    first = time.perf_counter() - start
    start = time.perf_counter()
    fn(x)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    second = time.perf_counter() - start
    err = float((out - tiny(x)).abs().max())
    return {
        "ok": err < 1e-4,
        "compile_s": first,
        "second_call_ms": second * 1e3,
        "max_abs_err": err,
        "backend": backend,
        "device": device,
    }


def allreduce(backend: str, numel: int, reps: int, timeout_s: float) -> dict[str, Any]:
    """One rank: init the group from env://, all_reduce ``rank + 1``, check the sum, time ``reps`` calls."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    start = time.perf_counter()
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    init_s = time.perf_counter() - start
    try:
        t = torch.full((numel,), float(rank + 1), device=device)
        dist.all_reduce(t)  # warm-up, and the correctness check
        expected = world * (world + 1) / 2
        ok = bool(torch.all(t == expected))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        per_call = (time.perf_counter() - start) / reps
    finally:
        dist.destroy_process_group()
    nbytes = numel * 4
    # ring all_reduce bus bandwidth, as nccl-tests reports it: 2(n-1)/n x bytes / time
    busbw = 2 * (world - 1) / world * nbytes / per_call / 1e9 if world > 1 else None
    return {
        "ok": ok,
        "rank": rank,
        "world_size": world,
        "backend": backend,
        "init_s": init_s,
        "ms_per_call": per_call * 1e3,
        "bytes": nbytes,
        "bus_gb_s": busbw,
    }


def main(argv: list[str] | None = None) -> int:
    """Run one probe and print its ``PROBE-RESULT`` line; errors become ``{"ok": false, "error": ...}``."""
    parser = argparse.ArgumentParser(prog="probe_worker")
    sub = parser.add_subparsers(dest="probe", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--device", default="cpu")
    c.add_argument("--backend", default="inductor")
    a = sub.add_parser("allreduce")
    a.add_argument("--backend", default="gloo")
    a.add_argument("--numel", type=int, default=1 << 18)
    a.add_argument("--reps", type=int, default=5)
    a.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        if args.probe == "compile":
            result = compile_once(args.device, args.backend)
        else:
            result = allreduce(args.backend, args.numel, args.reps, args.timeout)
    except Exception as exc:  # the parent reports it as a failed probe with this sentence
        lines = str(exc).strip().splitlines()
        _emit({"ok": False, "error": f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]})
        return 1
    _emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

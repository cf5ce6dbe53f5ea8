"""Quick probes that run real work: matmul per device, bf16 / fp16 vs fp32, one torch.compile,
an all_reduce between two local processes. Each has a timeout; ``scalpel env --no-probe`` skips all.

The in-process probes (matmul, lowp) run in a daemon thread joined with a timeout, so a wedged
device cannot hang ``scalpel env``; compile and all_reduce run in child processes (a cold inductor
compile takes 15-25 s on a small CPU, and a process group must not live in scalpel's process),
killed with their whole process group on timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from torchscalpel.childproc import child_env, kill_tree
from torchscalpel.envcheck.probe_worker import MARKER
from torchscalpel.netutil import free_port

PROBES: tuple[str, ...] = ("matmul", "lowp", "compile", "allreduce")
"""Probe names, in the order they run; ``--probe`` takes a comma-separated subset."""

# Work sizes: big enough to be timed above timer noise, small enough that fp16 at ~1 GFLOP/s
# (CPUs without native fp16 matmul) still finishes in tens of milliseconds.
CPU_N, GPU_N = 256, 4096
TIME_BUDGET_S = 0.2  # per dtype and device: repeat the matmul until this much time has passed


@dataclass(kw_only=True, slots=True)
class ProbeResult:
    """One probe on one device: ``ok``, ``failed``, ``timeout`` or ``skipped``, with its numbers."""

    name: str
    device: str
    status: str
    seconds: float = 0.0
    detail: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form for ``scalpel env --json``."""
        return asdict(self)


def _devices() -> list[str]:
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return devices


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def _with_timeout(name: str, device: str, timeout: float, fn: Callable[[], ProbeResult]) -> ProbeResult:
    """Run ``fn`` in a daemon thread; a timeout leaves it behind (it cannot be killed) and says so."""
    box: list[ProbeResult | BaseException] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # reported as a failed probe, never raised into the CLI
            box.append(exc)

    start = time.perf_counter()
    thread = threading.Thread(target=target, name=f"probe-{name}-{device}", daemon=True)
    thread.start()
    thread.join(timeout)
    elapsed = time.perf_counter() - start
    if not box:
        return ProbeResult(
            name=name,
            device=device,
            status="timeout",
            seconds=elapsed,
            detail=f"did not finish within {timeout:g} s",
        )
    outcome = box[0]
    if isinstance(outcome, BaseException):
        text = str(outcome).strip().splitlines()
        return ProbeResult(
            name=name,
            device=device,
            status="failed",
            seconds=elapsed,
            detail=f"{type(outcome).__name__}: {text[0] if text else ''}"[:300],
        )
    outcome.seconds = elapsed
    return outcome


def _time_matmul(a: Any, b: Any, device: str, budget: float) -> tuple[Any, float, int]:
    """Repeat ``a @ b`` until ``budget`` seconds pass (at least twice); returns (result, best s per call, reps).

    The best repetition, not the mean: the machine may be shared, and a neighbour's burst should
    not make fp32 look slow next to bf16 measured a moment later.
    """
    out = a @ b  # warm-up (and the result to check)
    _sync(device)
    reps, best, start = 0, float("inf"), time.perf_counter()
    while True:
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
        reps += 1
        if (reps >= 2 and time.perf_counter() - start >= budget) or reps >= 1000:
            return out, best, reps


def matmul_probe(device: str, budget: float = TIME_BUDGET_S) -> ProbeResult:
    """An fp32 matmul on ``device``: does it run, is it right (vs float64), how many GFLOP/s."""
    import torch

    n = GPU_N if device.startswith("cuda") else CPU_N
    gen = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    a, b = a32.to(device), b32.to(device)
    out, per_call, reps = _time_matmul(a, b, device, budget)
    ref = a32[:16].double() @ b32.double()
    err = float((out[:16].cpu().double() - ref).abs().max() / ref.abs().max())
    gflops = 2 * n**3 / per_call / 1e9
    ok = err < 1e-3  # TF32 (if the user enabled it) stays near 1e-3; garbage is far above
    return ProbeResult(
        name="matmul",
        device=device,
        status="ok" if ok else "failed",
        detail=f"{gflops:,.1f} GFLOP/s fp32 at n={n}" if ok else f"wrong result: relative error {err:.2e}",
        metrics={"n": n, "gflops": gflops, "reps": reps, "rel_err": err},
    )


def lowp_probe(device: str, budget: float = 3 * TIME_BUDGET_S) -> ProbeResult:
    """bf16 and fp16 matmul on ``device``: supported, speed relative to fp32, error vs fp32.

    The three dtypes are interleaved (one call of each per round, best call per dtype kept), so
    a burst of load from a neighbour hits them alike and the ratios stay fair.
    """
    import torch

    n = GPU_N if device.startswith("cuda") else CPU_N
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=gen).to(device), torch.randn(n, n, generator=gen).to(device)
    ref = a @ b
    metrics: dict[str, Any] = {"n": n}
    operands: dict[str, tuple[Any, Any]] = {"fp32": (a, b)}
    for dtype, label in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        try:
            x, y = a.to(dtype), b.to(dtype)
            out = x @ y  # warm-up, and the result to compare
            _sync(device)
        except Exception as exc:  # unsupported dtype on this device is a result, not a failure
            metrics[label] = {"supported": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        operands[label] = (x, y)
        metrics[label] = {
            "supported": True,
            "rel_err": float((out.float() - ref).abs().max() / ref.abs().max()),
        }
    best = dict.fromkeys(operands, float("inf"))
    rounds, start = 0, time.perf_counter()
    while rounds < 2 or (time.perf_counter() - start < budget and rounds < 500):
        for label, (x, y) in operands.items():
            t0 = time.perf_counter()
            x @ y
            _sync(device)
            best[label] = min(best[label], time.perf_counter() - t0)
        rounds += 1
    metrics["fp32_gflops"] = 2 * n**3 / best["fp32"] / 1e9
    metrics["rounds"] = rounds
    parts = []
    for label in ("bf16", "fp16"):
        if not metrics[label]["supported"]:
            parts.append(f"{label} unsupported")
            continue
        metrics[label]["gflops"] = 2 * n**3 / best[label] / 1e9
        metrics[label]["speedup_vs_fp32"] = best["fp32"] / best[label]
        parts.append(f"{label} {metrics[label]['speedup_vs_fp32']:.2f}x fp32")
    return ProbeResult(name="lowp", device=device, status="ok", detail=", ".join(parts), metrics=metrics)


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _parse_result(output: str) -> dict[str, Any] | None:
    for line in reversed(output.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    return None


def _last_line(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.strip() and not ln.startswith(MARKER)]
    return lines[-1][:300] if lines else "no output"


def compile_probe(device: str = "cpu", timeout: float = 120.0, backend: str = "inductor") -> ProbeResult:
    """One ``torch.compile`` of a tiny function in a child process; reports the compile time."""
    env = child_env()
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no worker pool: faster for one tiny kernel
    argv = [
        sys.executable,
        "-m",
        "torchscalpel.envcheck.probe_worker",
        "compile",
        "--device",
        device,
        "--backend",
        backend,
    ]
    start = time.perf_counter()
    proc = _spawn(argv, env)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        proc.communicate()
        return ProbeResult(
            name="compile",
            device=device,
            status="timeout",
            seconds=time.perf_counter() - start,
            detail=f"torch.compile ({backend}) did not finish within {timeout:g} s",
        )
    elapsed = time.perf_counter() - start
    result = _parse_result(output)
    if result is None:
        return ProbeResult(
            name="compile",
            device=device,
            status="failed",
            seconds=elapsed,
            detail=f"child exited with {proc.returncode}: {_last_line(output)}",
        )
    if not result.get("ok"):
        detail = result.get("error") or f"compiled result differs from eager by {result.get('max_abs_err')}"
        return ProbeResult(
            name="compile", device=device, status="failed", seconds=elapsed, detail=detail, metrics=result
        )
    return ProbeResult(
        name="compile",
        device=device,
        status="ok",
        seconds=elapsed,
        metrics=result,
        detail=f"{backend}: first call {result['compile_s']:.1f} s, then {result['second_call_ms']:.2f} ms",
    )


def allreduce_probe(backend: str = "gloo", world: int = 2, timeout: float = 60.0) -> ProbeResult:
    """An all_reduce between ``world`` local processes over loopback; checks the sum and times it."""
    port = free_port()
    base = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "OMP_NUM_THREADS": "1",
    }
    if backend == "gloo":
        base["GLOO_SOCKET_IFNAME"] = "lo0" if sys.platform == "darwin" else "lo"
    argv = [
        sys.executable,
        "-m",
        "torchscalpel.envcheck.probe_worker",
        "allreduce",
        "--backend",
        backend,
        "--timeout",
        str(max(5.0, timeout - 5)),
    ]
    start = time.perf_counter()
    procs = [_spawn(argv, child_env(**base, RANK=str(r), LOCAL_RANK=str(r))) for r in range(world)]
    outputs: list[str] = []
    timed_out = False
    for proc in procs:
        left = max(0.1, timeout - (time.perf_counter() - start))
        try:
            outputs.append(proc.communicate(timeout=left)[0])
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc)
            outputs.append(proc.communicate()[0])
    for proc in procs:  # a rank still waiting for a dead peer
        if proc.poll() is None:
            kill_tree(proc)
            proc.communicate()
    elapsed = time.perf_counter() - start
    device = "cuda" if backend == "nccl" else "cpu"
    name = f"allreduce-{backend}"
    if timed_out:
        return ProbeResult(
            name="allreduce",
            device=device,
            status="timeout",
            seconds=elapsed,
            detail=f"{backend} all_reduce of {world} ranks did not finish within {timeout:g} s",
        )
    results = [_parse_result(o) for o in outputs]
    bad = [(r, o, p) for r, o, p in zip(results, outputs, procs, strict=True) if not r or not r.get("ok")]
    if bad:
        res, out, proc = bad[0]
        detail = (res or {}).get("error") or f"rank exited with {proc.returncode}: {_last_line(out)}"
        return ProbeResult(
            name="allreduce",
            device=device,
            status="failed",
            seconds=elapsed,
            detail=detail,
            metrics={"backend": backend, "world_size": world},
        )
    r0 = results[0] or {}
    metrics = {
        "backend": backend,
        "world_size": world,
        "init_s": r0.get("init_s"),
        "ms_per_call": r0.get("ms_per_call"),
        "bytes": r0.get("bytes"),
        "bus_gb_s": r0.get("bus_gb_s"),
        "exit_codes": [p.returncode for p in procs],
    }
    note = ""
    if any(p.returncode for p in procs):
        # Known torch 2.13 gloo hazard: a rank aborts at interpreter exit after finishing its work.
        note = f" (a rank exited with {[p.returncode for p in procs]} after reporting success)"
    bw = f", {metrics['bus_gb_s']:.2f} GB/s bus" if metrics["bus_gb_s"] else ""
    return ProbeResult(
        name="allreduce",
        device=device,
        status="ok",
        seconds=elapsed,
        metrics=metrics,
        detail=f"{name}, {world} ranks: {metrics['ms_per_call']:.2f} ms per 1 MiB call{bw}{note}",
    )


def run_probes(
    names: tuple[str, ...] | list[str] = PROBES,
    *,
    timeout: float = 60.0,
    compile_timeout: float = 180.0,
    on_result: Callable[[ProbeResult], None] | None = None,
) -> list[ProbeResult]:
    """Run the named probes (in :data:`PROBES` order) and return one result per probe and device."""
    import torch

    results: list[ProbeResult] = []

    def add(result: ProbeResult) -> None:
        results.append(result)
        if on_result:
            on_result(result)

    devices = _devices()
    for name in [p for p in PROBES if p in names]:
        if name == "matmul":
            for dev in devices:
                add(_with_timeout("matmul", dev, timeout, partial(matmul_probe, dev)))
        elif name == "lowp":
            for dev in devices:
                add(_with_timeout("lowp", dev, timeout, partial(lowp_probe, dev)))
        elif name == "compile":
            add(compile_probe("cuda:0" if torch.cuda.is_available() else "cpu", timeout=compile_timeout))
        elif name == "allreduce":
            import torch.distributed as dist

            if not dist.is_available() or not dist.is_gloo_available():
                add(
                    ProbeResult(
                        name="allreduce",
                        device="cpu",
                        status="skipped",
                        detail="torch.distributed / gloo not in this build",
                    )
                )
            else:
                add(allreduce_probe("gloo", 2, timeout))
            if torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available():
                add(allreduce_probe("nccl", min(2, torch.cuda.device_count()), timeout))
    return results

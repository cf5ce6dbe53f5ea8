"""Write the small Kineto-shaped traces committed under tests/data/traces/ (deterministic).

    python scripts/make_test_traces.py            # rewrites tests/data/traces/*/...json.gz

Every figure in them follows from the layout below, so tests/unit/test_trace_committed.py asserts
exact numbers. Shapes follow what torch.profiler/Kineto write: ``ProfilerStep#N`` annotations,
``cpu_op`` and ``cuda_runtime`` events on the host thread, ``kernel`` / ``gpu_memcpy`` events on GPU
streams joined to their launches by ``args.correlation``, ``distributedInfo`` and
``deviceProperties`` metadata. They stand in for the HolisticTraceAnalysis traces in
../shared/data/traces when that folder is absent.

Per step of ``STEP_US`` µs (times relative to the step start), on rank r:
  host:   aten::mm [10, 110) launching gemm; aten::add_ [150, 190) launching the elementwise kernel;
          nccl:all_reduce [300, 340) launching the collective; aten::copy_ [400, 430) launching a memcpy
  stream 7:  ampere_sgemm_128x128_tn [100, 400), vectorized_elementwise_kernel [400, 450),
             Memcpy HtoD [600, 620)
  stream 20: ncclKernel_AllReduce_RING_LL_Sum_float [350, 350 + COMM_US[r])
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces"
STEP_US = 1000
STEPS = 8
FIRST_STEP = 10
BASE_US = 5_000_000
COMM_US = {0: 200, 1: 100}
GEMM = "ampere_sgemm_128x128_tn"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)"
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
MEMCPY = "Memcpy HtoD (Pageable -> Device)"


def _x(
    name: str, cat: str, ts: float, dur: float, *, tid: int = 1, pid: int = 100, **args: Any
) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


def _meta(rank: int | None, device_name: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
    }
    if device_name:
        meta["deviceProperties"] = [
            {
                "id": 0,
                "name": device_name,
                "totalGlobalMem": 85_000_000_000,
                "computeMajor": 9,
                "computeMinor": 0,
                "numSms": 132,
            }
        ]
    if rank is not None:
        meta["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    return meta


def gpu_rank(
    rank: int,
    *,
    device_name: str = "NVIDIA H100 80GB HBM3",
    launch: str = "cudaLaunchKernel",
    offset: float = 0.0,
) -> dict[str, Any]:
    """One rank's trace; ``offset`` shifts every GPU event (fractional: sub-microsecond timestamps)."""
    ev: list[dict[str, Any]] = []
    corr = 1000
    for k in range(STEPS):
        t0 = BASE_US + k * STEP_US
        ev.append(_x(f"ProfilerStep#{FIRST_STEP + k}", "user_annotation", t0, STEP_US))
        host = [
            ("aten::mm", 10, 100, launch, 20, GEMM, "kernel", 7, 100, 300),
            ("aten::add_", 150, 40, launch, 160, ELEMENTWISE, "kernel", 7, 400, 50),
            ("nccl:all_reduce", 300, 40, launch, 310, NCCL, "kernel", 20, 350, COMM_US[rank]),
            ("aten::copy_", 400, 30, "cudaMemcpyAsync", 405, MEMCPY, "gpu_memcpy", 7, 600, 20),
        ]
        for op, ots, odur, rt, rts, kname, kcat, stream, kts, kdur in host:
            corr += 1
            ev.append(_x(op, "cpu_op", t0 + ots, odur, **{"External id": corr}))
            ev.append(_x(rt, "cuda_runtime", t0 + rts, 5, correlation=corr, **{"External id": corr}))
            ev.append(
                _x(
                    kname,
                    kcat,
                    t0 + kts + offset,
                    kdur,
                    pid=0,
                    tid=stream,
                    device=0,
                    stream=stream,
                    correlation=corr,
                    **{"External id": corr},
                )
            )
    ev.append({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}})
    ev.append({"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "python"}})
    return {**_meta(rank, device_name), "traceEvents": ev}


def cpu_only(rank: int = 3) -> dict[str, Any]:
    """Three CPU steps of 500 µs: aten::addmm [0, 200) with aten::empty [10, 30) inside, aten::relu [250, 300)."""
    ev: list[dict[str, Any]] = []
    for k in range(3):
        t0 = BASE_US + k * 500
        ev.append(_x(f"ProfilerStep#{5 + k}", "user_annotation", t0, 500))
        ev.append(_x("aten::addmm", "cpu_op", t0, 200))
        ev.append(_x("aten::empty", "cpu_op", t0 + 10, 20))
        ev.append(_x("aten::relu", "cpu_op", t0 + 250, 50))
    return {**_meta(rank, None), "traceEvents": ev}


def compare(test: bool) -> dict[str, Any]:
    """One step; the test trace adds aten::cat and runs the gemm three times instead of once."""
    ev = [_x("ProfilerStep#1", "user_annotation", BASE_US, 1000), _x("aten::mm", "cpu_op", BASE_US + 10, 50)]
    kernels = 3 if test else 1
    for i in range(kernels):
        ev.append(_x("cudaLaunchKernel", "cuda_runtime", BASE_US + 20 + i, 1, correlation=i + 1))
        ev.append(
            _x(
                GEMM,
                "kernel",
                BASE_US + 100 + 100 * i,
                80,
                pid=0,
                tid=7,
                device=0,
                stream=7,
                correlation=i + 1,
            )
        )
    if test:
        ev.append(_x("aten::cat", "cpu_op", BASE_US + 500, 30))
    return {**_meta(None, "NVIDIA H100 80GB HBM3"), "traceEvents": ev}


def files() -> dict[str, dict[str, Any]]:
    return {
        "gpu_2rank/rank-0.json.gz": gpu_rank(0),
        "gpu_2rank/rank-1.json.gz": gpu_rank(1),
        "cpu_only/rank-3.json.gz": cpu_only(),
        "rocm_mi250/trace.json.gz": {
            **gpu_rank(0, device_name="AMD Instinct MI250X", launch="hipLaunchKernel", offset=0.25),
            "distributedInfo": {"backend": "rccl", "rank": 0, "world_size": 1},
        },
        "compare/base.json.gz": compare(False),
        "compare/test.json.gz": compare(True),
    }


def main() -> None:
    for rel, data in files().items():
        path = OUT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = json.dumps(data).encode()  # one line, events as json.dumps writes them: `}, {"ph": ...`
        path.write_bytes(gzip.compress(raw, compresslevel=9, mtime=0))  # mtime=0: same bytes every time
        print(
            f"{path.relative_to(OUT.parents[2])}: {len(data['traceEvents'])} events, {path.stat().st_size} bytes"
        )


if __name__ == "__main__":
    main()

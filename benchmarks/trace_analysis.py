"""Benchmark: ``scalpel analyze`` vs HolisticTraceAnalysis on a large tiled trace (results in BENCHMARKS.md).

Claim: on a 1 GiB uncompressed trace, end-to-end analysis (per-step temporal breakdown plus kernel
breakdown) is at least 5x faster than HTA computing its temporal and kernel breakdowns on the same
file, with at most 1/5 of its peak memory (child-process peak RSS), measured in the same run.

HTA is a benchmark-only dependency. Set up its venv once (never in requirements-dev.txt)::

    python3 -m venv /work/bench-venv
    /work/bench-venv/bin/pip download --no-deps holistictraceanalysis==0.5.0 -d /tmp/hta
    PIP_CONSTRAINT=constraints.txt /work/bench-venv/bin/pip install --no-deps /tmp/hta/holistictraceanalysis-*.whl
    PIP_CONSTRAINT=constraints.txt /work/bench-venv/bin/pip install numpy pandas plotly networkx pydot pyyaml psutil

(``--no-deps`` because HTA's metadata pulls jupyterlab and pytest, which the breakdowns do not use.)

Usage::

    python benchmarks/trace_analysis.py build --size-mb 1024 --steps 10 --out /tmp/scalpel-bench/big10/rank-0.json
    python benchmarks/trace_analysis.py run --trace /tmp/scalpel-bench/big10/rank-0.json --hta-python /work/bench-venv/bin/python
    python benchmarks/trace_analysis.py build --size-mb 1024            # tiles keep their steps (~1200 steps)
    python benchmarks/trace_analysis.py run --hta-python /work/bench-venv/bin/python
    python benchmarks/trace_analysis.py parsers --size-mb 128            # parser choice: msgspec vs ijson vs json
    python benchmarks/trace_analysis.py record-hta                       # re-record tests/data/hta_*.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SCALPEL_SHARED_DIR", REPO.parent / "shared"))
TRACES = SHARED / "data" / "traces"
WORKER = Path(__file__).with_name("_hta_worker.py")
DEFAULT_OUT = Path("/tmp/scalpel-bench")


def build(source: Path, out: Path, size_mb: int, steps: int = 0) -> Path:
    """Tile ``source`` until ``out`` holds ``size_mb`` MiB: timestamps shifted, ids and step numbers renumbered.

    ``steps=0`` keeps each tile's own step annotations (2 per tile of gpu_2rank: ~1200 steps at 1 GiB);
    ``steps=N`` drops them and writes N ``ProfilerStep`` annotations that each span a run of tiles,
    the shape of a real large trace (a few long steps of a big model).
    """
    d = json.loads(gzip.decompress(source.read_bytes()) if source.suffix == ".gz" else source.read_bytes())
    events = d["traceEvents"]
    meta = {k: v for k, v in d.items() if k != "traceEvents"}
    xs = [e for e in events if e.get("ph") == "X" and "ts" in e]
    t0 = min(e["ts"] for e in xs)
    span = max(e["ts"] + e.get("dur", 0) for e in xs) - t0 + 1000
    corr_span = 1 + max(
        (e.get("args", {}).get("correlation", 0) for e in events if isinstance(e.get("args"), dict)),
        default=0,
    )
    step_names = sorted({e["name"] for e in xs if str(e.get("name", "")).startswith("ProfilerStep#")})
    body = [e for e in events if e.get("ph") != "M" and not (steps and e.get("name") in step_names)]
    step_tid = next((e["tid"] for e in xs if e.get("name") in step_names), 0)
    step_pid = next((e["pid"] for e in xs if e.get("name") in step_names), 0)
    head = [e for e in events if e.get("ph") == "M"]
    out.parent.mkdir(parents=True, exist_ok=True)
    target = size_mb << 20
    with out.open("w") as fh:
        fh.write(json.dumps(meta)[:-1] + ', "traceEvents": [')
        fh.write(", ".join(json.dumps(e) for e in head))
        written, k = fh.tell(), 0
        while written < target:
            parts = []
            for e in body:
                e2 = dict(e)
                e2["ts"] = e["ts"] + k * span
                args = e.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e2["args"] = dict(args, correlation=args["correlation"] + k * corr_span)
                if e.get("name") in step_names:
                    e2["name"] = f"ProfilerStep#{k * len(step_names) + step_names.index(e['name'])}"
                if "id" in e and e.get("ph") in ("s", "f"):
                    e2["id"] = e["id"] + k * corr_span
                parts.append(json.dumps(e2))
            fh.write(", " + ", ".join(parts))
            written = fh.tell()
            k += 1
        if steps:  # N steps, each spanning ceil(k / N) tiles, written after the tiles (order does not matter)
            per = -(-k // steps)
            marks = [
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"ProfilerStep#{i}",
                    "pid": step_pid,
                    "tid": step_tid,
                    "ts": t0 + i * per * span,
                    "dur": min(per, k - i * per) * span - 1,
                }
                for i in range(steps)
                if i * per < k
            ]
            fh.write(", " + ", ".join(json.dumps(m) for m in marks))
        fh.write("]}")
    print(f"built {out} ({out.stat().st_size / 2**20:.0f} MiB, {k} tiles of {source.name})")
    return out


def _child(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict:
    """Run a child; wall time, peak RSS (wait4 rusage) and its stdout's last JSON line."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = t0 + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            return {
                "ok": False,
                "error": f"timed out after {timeout:.0f} s",
                "wall_s": time.perf_counter() - t0,
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "peak_rss_mb": usage.ru_maxrss / 1024,
            }
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    out, err = proc.stdout.read(), proc.stderr.read()
    code = os.waitstatus_to_exitcode(status)
    res = {
        "ok": code == 0,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "exit": code,
    }
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if lines:
        res["result"] = json.loads(lines[-1])
    if code != 0:
        res["error"] = err[-2000:]
    return res


_OURS = """
import json, sys, time
from pathlib import Path
from torchscalpel.trace import analyze_traces
t = time.perf_counter()
r = analyze_traces([Path(sys.argv[1])]).to_dict()
g = r["ranks"][0]["gpu"]
print(json.dumps({"analysis_s": time.perf_counter() - t, "steps": len(r["ranks"][0]["steps"]),
                  "kernel_time_us": g["kernel_time_us"], "compute_us": g["compute_us"], "idle_us": g["idle_us"]}))
"""

_PARSE = """
import json, sys, time
from pathlib import Path
mode, path = sys.argv[1], Path(sys.argv[2])
t, c = time.perf_counter(), time.process_time()
n = 0
if mode == "ijson":
    import ijson
    assert ijson.backend == "yajl2_c", ijson.backend
    with path.open("rb") as fh:
        for ev in ijson.items(fh, "traceEvents.item", use_float=True):
            n += 1
elif mode == "json":
    n = len(json.loads(path.read_bytes())["traceEvents"])
else:
    from torchscalpel.trace import reader
    reader.USE_MSGSPEC = mode == "msgspec-chunks"
    for batch in reader.TraceReader(path).batches():
        n += len(batch)
print(json.dumps({"events": n, "parse_s": time.perf_counter() - t, "parse_cpu_s": time.process_time() - c}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    return env


def run(trace: Path, hta_python: str, timeout: float, skip_hta: bool) -> dict:
    size_mb = trace.stat().st_size / 2**20
    print(f"trace: {trace} ({size_mb:.0f} MiB)")
    ours = _child([sys.executable, "-c", _OURS, str(trace)], timeout, _env())
    print("scalpel analyze:", json.dumps(ours))
    report = {"trace_mb": size_mb, "ours": ours}
    if ours.get("ok"):
        ours["mb_per_s"] = size_mb / ours["wall_s"]
    if not skip_hta:
        hta = _child(
            [hta_python, str(WORKER), "bench", str(trace.parent)],
            timeout,
            dict(os.environ, OMP_NUM_THREADS="1"),
        )
        print("HolisticTraceAnalysis:", json.dumps(hta)[:3000])
        report["hta"] = hta
        if hta.get("ok") and ours.get("ok"):
            report["speedup"] = hta["wall_s"] / ours["wall_s"]
            report["memory_ratio"] = hta["peak_rss_mb"] / ours["peak_rss_mb"]
            a, b = ours["result"]["kernel_time_us"], hta["result"]["kernel_time_us"][0]
            report["kernel_time_agreement"] = a / b
    print(json.dumps({k: v for k, v in report.items() if k not in ("ours", "hta")}, indent=1))
    return report


def parsers(trace: Path, timeout: float) -> None:
    size_mb = trace.stat().st_size / 2**20
    for mode in ("msgspec-chunks", "json-chunks", "ijson", "json"):
        r = _child([sys.executable, "-c", _PARSE, mode, str(trace)], timeout, _env())
        res = r.get("result", {})
        cpu = res.get("parse_cpu_s", float("nan"))
        print(
            f"{mode:15s} events {res.get('events', 0):>9}  parse wall {res.get('parse_s', float('nan')):7.2f} s  "
            f"CPU {cpu:7.2f} s = {size_mb / cpu:6.1f} MB/s per CPU-second  peak RSS {r['peak_rss_mb']:6.0f} MiB "
            f"{r.get('error', '')[:200]}"
        )


def record_hta(hta_python: str) -> None:
    cases = {
        "gpu_2rank": ["gpu_2rank/rank-0.json.gz", "gpu_2rank/rank-1.json.gz"],
        "alexnet_gpu": ["alexnet_gpu/trace.json.gz"],
        "rocm_mi250": ["rocm_mi250/trace.json.gz"],
        "compare_base": ["compare/base.json.gz"],
        "compare_test": ["compare/test.json.gz"],
    }
    for name, files in cases.items():
        out = REPO / "tests" / "data" / f"hta_{name}.json"
        subprocess.run(
            [hta_python, str(WORKER), "record", str(out), *[str(TRACES / f) for f in files]], check=True
        )
        print("recorded", out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--source", type=Path, default=TRACES / "gpu_2rank" / "rank-0.json.gz")
    b.add_argument("--size-mb", type=int, default=1024)
    b.add_argument("--out", type=Path, default=DEFAULT_OUT / "big" / "rank-0.json")
    b.add_argument("--steps", type=int, default=0, help="0: keep each tile's steps; N: N long steps")
    r = sub.add_parser("run")
    r.add_argument("--trace", type=Path, default=DEFAULT_OUT / "big" / "rank-0.json")
    r.add_argument("--hta-python", default="/work/bench-venv/bin/python")
    r.add_argument("--timeout", type=float, default=3600)
    r.add_argument("--skip-hta", action="store_true")
    r.add_argument("--save", type=Path, help="write the figures as JSON here")
    p = sub.add_parser("parsers")
    p.add_argument("--source", type=Path, default=TRACES / "gpu_2rank" / "rank-0.json.gz")
    p.add_argument("--size-mb", type=int, default=128)
    p.add_argument("--timeout", type=float, default=1200)
    h = sub.add_parser("record-hta")
    h.add_argument("--hta-python", default="/work/bench-venv/bin/python")
    args = ap.parse_args()
    if args.cmd == "build":
        build(args.source, args.out, args.size_mb, args.steps)
    elif args.cmd == "run":
        if not args.trace.exists():
            sys.exit(f"{args.trace} does not exist; run 'build' first")
        rep = run(args.trace, args.hta_python, args.timeout, args.skip_hta)
        if args.save:
            args.save.write_text(json.dumps(rep, indent=1))
    elif args.cmd == "parsers":
        out = DEFAULT_OUT / f"parsers-{args.size_mb}" / "rank-0.json"
        if not out.exists():
            build(args.source, out, args.size_mb)
        parsers(out, args.timeout)
    else:
        record_hta(args.hta_python)


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()

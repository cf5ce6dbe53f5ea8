"""Reading a large memory snapshot: ``scalpel memory SNAPSHOT`` against memory_viz's own parser, same run.

Run: ``PYTHONPATH=src python benchmarks/memory_snapshot.py [--size-mb 1024]``

Writes a synthetic snapshot of about the given size in each of two shapes: ``torch`` (laid out as
torch's ``_cuda_memorySnapshot`` writes one: shared key strings and frame dicts, a new traceback list
per allocation, shared with the trace's alloc event of a live block) and ``fresh-strings`` (the
pessimistic one: five frames per block, each a new dict of new strings). Then, in fresh subprocesses,
interleaved: (a) ``scalpel memory SNAPSHOT``'s reader + explanation (the native reader when a C compiler
exists, else the pure-Python one; each row says which ran), (b) ``pickle.load`` +
``torch.cuda._memory_viz.segsum`` (memory_viz's parser and its text summary). Reports wall time, CPU
time and peak RSS (``VmHWM``, which exec resets; ``ru_maxrss`` would carry over the generating parent's)
of each. The snapshot is written by a child process for the same reason, in a temporary folder
(``$SNAPSHOT_BENCH_DIR``, else the system's) that is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OURS = """
import resource, sys, time
from pathlib import Path
t = time.perf_counter()
from torchscalpel.memory.snapshot import explain_snapshot
r = explain_snapshot(Path(sys.argv[1]))
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
ru = resource.getrusage(resource.RUSAGE_SELF)
print(time.perf_counter() - t, hwm, ru.ru_utime + ru.ru_stime, r["reader"], r["blocks"])
"""
PEER = """
import pickle, resource, sys, time
t = time.perf_counter()
from torch.cuda import _memory_viz
with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
text = _memory_viz.segsum(data)
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
ru = resource.getrusage(resource.RUSAGE_SELF)
print(time.perf_counter() - t, hwm, ru.ru_utime + ru.ru_stime, "memory_viz", len(text))
"""


def _own(text: str) -> str:
    """A fresh string object, as the C++ snapshot code makes one per frame (pickle memoizes shared objects)."""
    return text[:1] + text[1:]


def frames(i: int) -> list[dict[str, object]]:
    return [{k: _own(v) if isinstance(v, str) else v for k, v in f.items()} for f in _frames(i)]


def _frames(i: int) -> list[dict[str, object]]:
    return [
        {
            "filename": "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py",
            "line": 125,
            "name": "forward",
        },
        {"filename": f"/home/user/project/model_{i % 50}.py", "line": 10 + i % 300, "name": "forward"},
        {"filename": "/home/user/project/train.py", "line": 88, "name": "train_step"},
        {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"},
        {"filename": "??", "line": 0, "name": "at::native::empty_cuda"},
    ]


def write_snapshot(path: Path, size_mb: int) -> None:
    """About ``size_mb`` MB of snapshot, written in one pickle like torch's _dump_snapshot."""
    per_block = 340  # bytes each pickled block takes with its frames (measured on this generator)
    n_blocks = size_mb * 10**6 // per_block
    segments, blocks_per_seg, addr, i = [], 64, 0, 0
    while i < n_blocks:
        blocks = []
        for j in range(blocks_per_seg):
            size = 512 * (1 + (i * 7 + j) % 4096)
            state = "inactive" if j % 9 == 0 else "active_allocated"
            blocks.append(
                {
                    "address": addr,
                    "size": size,
                    "requested_size": size - 17,
                    "state": state,
                    "frames": frames(i),
                }
            )
            addr += size
            i += 1
        segments.append(
            {
                "device": 0,
                "address": addr,
                "total_size": sum(b["size"] for b in blocks),
                "allocated_size": 0,
                "active_size": 0,
                "requested_size": 0,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
    data = {
        "segments": segments,
        "device_traces": [
            [
                {
                    "action": "oom",
                    "addr": 0,
                    "size": 2**30,
                    "stream": 0,
                    "device_free": 10**8,
                    "frames": frames(3),
                }
            ]
        ],
        "allocator_settings": {"expandable_segments": False},
    }
    with path.open("wb") as f:
        pickle.dump(data, f, protocol=4)


def write_torch_shaped(path: Path, size_mb: int) -> None:
    """About ``size_mb`` MB of snapshot laid out as torch writes one (``_cuda_memorySnapshot``).

    What torch shares, shared here (torch/csrc/cuda/Module.cpp, profiler/python/combined_traceback.cpp):
    the key and state strings are one object each (``py::str`` made once per snapshot); a frame is one dict
    per distinct frame, shared by every traceback that holds it (``py_symbolize`` dedups frames); a block's
    traceback is a new list per allocation, and the trace's ``alloc`` event of a block that is still live
    holds the same list (one ``CapturedTraceback`` per allocation, deduped by pointer). Pickle memoizes
    every shared object once and refers to it by index afterwards.
    """
    py_frames = [
        {"name": f"fn{i}", "filename": f"/home/user/project/model_{i % 40}.py", "line": 10 + i}
        for i in range(2000)
    ]
    torch_entry = [  # torch's own frames, as this torch names the ones that mark a phase (see snapshot.frame_code)
        ("_call_impl", "nn/modules/module.py"),
        ("linear", "nn/functional.py"),
        ("_init_group", "optim/adam.py"),
        ("_engine_run_backward", "autograd/graph.py"),
    ]
    torch_frames = [
        {
            "name": torch_entry[i % 4][0],
            "filename": f"/usr/lib/python3.11/site-packages/torch/{torch_entry[i % 4][1]}",
            "line": i,
        }
        for i in range(200)
    ]
    cpp_frames = [{"name": f"c10::cuda::fn{i}", "filename": "??", "line": 0} for i in range(600)]
    train = {"name": "train_step", "filename": "/home/user/project/train.py", "line": 88}
    state = {s: s for s in ("active_allocated", "inactive", "active_pending_free")}

    def traceback(i: int) -> list[dict[str, object]]:
        return [
            *(cpp_frames[(i * 7 + k) % 600] for k in range(6)),
            torch_frames[i % 200],
            torch_frames[(i + 3) % 200],
            py_frames[i % 2000],
            py_frames[(i * 13) % 2000],
            train,
        ]

    per_block = 134  # bytes each pickled block and its trace share take (measured on this generator)
    n_blocks = size_mb * 10**6 // per_block
    segments, trace, addr, i = [], [], 0, 0
    while i < n_blocks:
        blocks = []
        for j in range(64):
            size = 512 * (1 + (i * 7 + j) % 4096)
            tb = traceback(i)
            live = j % 9 != 0
            blocks.append(
                {
                    "address": addr,
                    "size": size,
                    "requested_size": size - 17,
                    "state": state["active_allocated" if live else "inactive"],
                    "frames": tb if live else [],
                }
            )
            if live and i % 4 == 0:  # the alloc event of a live block: the same traceback list
                trace.append(
                    {"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": i, "frames": tb}
                )
            elif i % 4 == 1:  # a block allocated and freed since: its own traceback
                tb2 = traceback(i + 1)
                trace.append(
                    {"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": i, "frames": tb2}
                )
                trace.append(
                    {
                        "action": "free_completed",
                        "addr": addr,
                        "size": size,
                        "stream": 0,
                        "time_us": i + 1,
                        "frames": tb2,
                    }
                )
            addr += size
            i += 1
        segments.append(
            {
                "device": 0,
                "address": addr,
                "total_size": sum(b["size"] for b in blocks),
                "allocated_size": 0,
                "active_size": 0,
                "requested_size": 0,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
    trace.append(
        {
            "action": "oom",
            "device_free": 10**8,
            "size": 2**30,
            "stream": 0,
            "time_us": i,
            "frames": traceback(3),
        }
    )
    data = {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {"expandable_segments": False},
    }
    with path.open("wb") as f:
        pickle.dump(data, f, protocol=4)


_ARG_BYTES = {0x95: 8, 0x80: 1, 0x4B: 1, 0x4D: 2, 0x4A: 4, 0x47: 8, 0x71: 1, 0x72: 4, 0x68: 1, 0x6A: 4}


def opcode_rate(size_mb: int) -> dict[str, float]:
    """Seconds per GB of a pure-Python loop that only steps over opcode arguments (builds nothing).

    The lower bound on any pure-Python streaming reader of this generator's snapshots.
    """
    import time

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "snapshot.pickle"
        write_snapshot(path, size_mb)
        data = path.read_bytes()
    t, i, n, end = time.perf_counter(), 0, 0, len(data)
    while i < end:
        op = data[i]
        i += 1
        n += 1
        if op == 0x8C or op == 0x8A:  # SHORT_BINUNICODE, LONG1: one length byte
            i += 1 + data[i]
        elif op == 0x58:  # BINUNICODE: four length bytes
            i += 4 + int.from_bytes(data[i : i + 4], "little")
        elif op == 0x2E:  # STOP
            break
        else:
            i += _ARG_BYTES.get(op, 0)
    dt = time.perf_counter() - t
    return {"bytes": len(data), "opcodes": n, "skip_s": dt, "skip_s_per_gb": dt * 2**30 / len(data)}


def run(code: str, path: Path, timeout: float) -> dict[str, object]:
    """One fresh subprocess: wall s, peak RSS, CPU s, which reader; or what went wrong."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"failed": f"did not finish in {timeout:.0f} s"}
    if out.returncode != 0:
        return {"failed": f"exit {out.returncode}: {(out.stderr.strip().splitlines() or [''])[-1][:200]}"}
    seconds, rss, cpu, reader, _ = out.stdout.split()
    return {"wall_s": float(seconds), "peak_rss": int(rss), "cpu_s": float(cpu), "reader": reader}


WRITERS = {"torch": "write_torch_shaped", "fresh-strings": "write_snapshot"}


def bench(
    shape: str, size_mb: int, rounds: int, timeout: float, keep: Path | None = None
) -> dict[str, object]:
    """Write one snapshot of ``shape`` in a child process, read it ``rounds`` times with each reader, interleaved.

    ``keep``: write the snapshot into this folder and leave it there (reused when it is already there).
    """
    with tempfile.TemporaryDirectory(dir=os.environ.get("SNAPSHOT_BENCH_DIR")) as d:
        path = (keep or Path(d)) / f"snapshot-{shape}-{size_mb}mb.pickle"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")}
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    f"import memory_snapshot as m, pathlib; "
                    f"m.{WRITERS[shape]}(pathlib.Path({str(path)!r}), {size_mb})",
                ],
                env=env,
                check=True,
            )
        size = path.stat().st_size
        ours, peer = [], []
        for _ in range(rounds):  # interleaved
            ours.append(run(OURS, path, timeout))
            peer.append(run(PEER, path, timeout))
    return {"shape": shape, "snapshot_bytes": size, "ours": ours, "memory_viz": peer}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--shape",
        choices=[*WRITERS, "both"],
        default="both",
        help="torch: frames shared as torch writes them; fresh-strings: a new string per frame",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds one read may take")
    parser.add_argument("--opcode-rate", action="store_true", help="only time a pure-Python opcode skipper")
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="write the snapshots into this folder and keep them (reused on the next run)",
    )
    parser.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="PATH",
        help="only write one snapshot of --size-mb MB in the --shape layout (torch unless given) to PATH, and stop",
    )
    args = parser.parse_args()
    if args.write is not None:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        globals()[WRITERS["torch" if args.shape == "both" else args.shape]](args.write, args.size_mb)
        print(f"wrote {args.write} ({args.write.stat().st_size / 1e6:.1f} MB)")
        return 0
    if args.opcode_rate:
        print(json.dumps(opcode_rate(args.size_mb)))
        return 0
    sys.path.insert(0, str(ROOT / "src"))
    from torchscalpel.memory.snapshot_native import load_library

    lib, why = load_library()  # compile once here, so no timed read pays for it
    print(json.dumps({"native_reader": lib is not None, "why_not": why}), flush=True)
    for shape in WRITERS if args.shape == "both" else [args.shape]:
        print(json.dumps(bench(shape, args.size_mb, args.rounds, args.timeout, args.keep)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

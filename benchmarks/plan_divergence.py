"""Where a plan and a real CUDA run part ways: per-op live memory of both, side by side.

For one of plan_accuracy.py's CUDA cases, runs the real training steps under a dispatch logger that
reads ``torch.cuda.memory_allocated()`` after every op, and the plan's simulation with the same
logger over its allocation tracker. Prints each phase's peak for both, the ops whose new output
bytes differ most in total, and the op at each peak; ``--json`` keeps the two per-op series.

    python benchmarks/plan_divergence.py --case llama --precision fp32 --json div.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).parent))
import plan_accuracy as pa
from plan_measure import train_steps
from torchscalpel.plan import simulate as sim
from torchscalpel.plan.simulate import OptimizerSpec, SimSettings, build_meta_model
from torchscalpel.plan.spec import parse_batch_spec
from torchscalpel.plan.tracker import SimulationTracker


def _storages(value) -> dict[int, int]:
    found = {}
    for t in tree_flatten(value)[0]:
        if isinstance(t, torch.Tensor):
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            found[st._cdata] = st.nbytes()
    return found


def _new_output_bytes(args, kwargs, out) -> int:
    """Bytes of the op's output storages that are not one of its inputs' (views, in-place ops)."""
    inputs = _storages((args, kwargs))
    return sum(n for key, n in _storages(out).items() if key not in inputs)


class RealLog(TorchDispatchMode):
    """(op, new output bytes, live bytes after) for every op of a real CUDA run."""

    def __init__(self, cuda: bool) -> None:
        super().__init__()
        self.cuda = cuda
        self.rows: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.rows.append(
            (
                str(func),
                _new_output_bytes(args, kwargs, out),
                torch.cuda.memory_allocated() if self.cuda else 0,
            )
        )
        return out


class FakeLog(SimulationTracker):
    """The plan's tracker, also noting the event count after every op."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.marks.append((str(func), _new_output_bytes(args, kwargs, out), len(self._events)))
        return out


def snapshot_peak(run, top: int = 15) -> None:
    """Run ``run`` with the CUDA allocator's history on; print what was live at its peak, by call site."""
    torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="python")
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    peak_stat = torch.cuda.max_memory_allocated() - base
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live: dict[int, tuple[int, str]] = {}
    total = best = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for ev in snap["device_traces"][0]:
        if ev["action"] == "alloc":
            frames = [
                f
                for f in ev.get("frames", [])
                if "torch/" not in f["filename"]
                or "nn/modules" in f["filename"]
                or "functional" in f["filename"]
            ]
            site = " < ".join(f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in frames[:3])
            live[ev["addr"]] = (ev["size"], site)
            total += ev["size"]
            if total > best:
                best, at_peak = total, dict(live)
        elif ev["action"] in ("free_requested",) and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, site in at_peak.values():
        sites[site][0] += size
        sites[site][1] += 1
    print(
        f"snapshot: max_memory_allocated {peak_stat / 2**20:.1f} MiB; replayed peak {best / 2**20:.1f} MiB "
        f"(incl. what was live before); live at peak by call site:"
    )
    for site, (size, n) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {size / 2**20:9.1f} MiB {n:4d}x  {site}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="llama", choices=sorted(pa.CUDA_CASES))
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--device", default="cuda", help="cpu only smoke-tests this script (no live bytes)")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="instead: the plain real run (3 steps, as plan_accuracy.py) with the allocator's history",
    )
    args = parser.parse_args()
    factory, kwargs, spec_text = pa.CUDA_CASES[args.case]
    spec = parse_batch_spec(spec_text)
    s = SimSettings(
        optimizer=OptimizerSpec.named("adamw"), precision=args.precision, foreach=True, device=args.device
    )
    cuda = args.device == "cuda"
    if args.snapshot:
        snapshot_peak(lambda: train_steps(factory(**kwargs).cuda(), spec, s, device="cuda"))
        return

    if cuda:
        torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated() if cuda else 0
    model = factory(**kwargs).to(args.device)
    log = RealLog(cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with log:
        train_steps(model, spec, s, device=args.device, steps=2)
    real = [(op, b, live - base) for op, b, live in log.rows]
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else 0.0
    print(f"real: {len(real)} ops, max_memory_allocated {peak:.1f} MiB")
    del model

    fake_log = FakeLog()
    original = sim.SimulationTracker
    sim.SimulationTracker = lambda: fake_log  # type: ignore[assignment, misc]
    try:
        sim.simulate(lambda: build_meta_model(lambda: factory(**kwargs), args.precision), spec, s)
    finally:
        sim.SimulationTracker = original  # type: ignore[misc]
    total = fake_log.timeline().total()
    fake = [(op, b, int(total[n - 1]) if n else 0) for op, b, n in fake_log.marks]
    print(f"fake: {len(fake)} ops")

    for name, rows in (("real", real), ("fake", fake)):
        i = max(range(len(rows)), key=lambda k: rows[k][2])
        ctx = [r[0].replace("aten.", "") for r in rows[max(0, i - 6) : i + 3]]
        print(f"{name} peak {rows[i][2] / 2**20:.1f} MiB at op {i}/{len(rows)} {rows[i][0]}; around: {ctx}")
    by_op: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for op, b, _ in real:
        by_op[op][0] += b
        by_op[op][2] += 1
    for op, b, _ in fake:
        by_op[op][1] += b
        by_op[op][3] += 1
    print("ops whose new output bytes differ most (real MiB, fake MiB, real calls, fake calls):")
    for op, (r, f, rc, fc) in sorted(by_op.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1]))[:25]:
        print(f"  {op:60s} {r / 2**20:10.1f} {f / 2**20:10.1f} {rc:6d} {fc:6d}")
    if args.json:
        args.json.write_text(json.dumps({"real": real, "fake": fake}))


if __name__ == "__main__":
    main()

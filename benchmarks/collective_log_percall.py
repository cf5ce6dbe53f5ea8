"""Per-call cost of the collective log's wrapper, this checkout against an earlier commit's, in one process.

Both recorders wrap the same no-op collective (the wrapper's own Python cost, nothing of gloo), and
blocks of calls alternate between them (and the bare no-op) so that a busy shared CPU slows all alike.
The earlier implementation is read from git (``git show REV:src/torchscalpel/runtime/collectives.py``).

Run: ``python benchmarks/collective_log_percall.py --against 1c50ec8`` (the last commit before the
per-call path was rewritten for issue 18).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _load_old(rev: str, folder: Path):
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:src/torchscalpel/runtime/collectives.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = folder / "old_collectives.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("torchscalpel.runtime._old_collectives", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--against", default="1c50ec8", help="the earlier commit (default: before issue 18's rewrite)"
    )
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    import torch

    from torchscalpel.runtime import collectives as new

    def noop(tensor, op=None, group=None, async_op=False):
        return None

    with tempfile.TemporaryDirectory() as tmp:
        old = _load_old(args.against, Path(tmp))
        old._OUR_DIR = (
            str(REPO / "src" / "torchscalpel") + os.sep
        )  # the caller (this file) is the user's for both
        variants = {
            "bare": noop,
            "old": old._wrap(old.CollectiveRecorder(Path(tmp) / "old", 0, 1, 0), "all_reduce", noop),
            "new": new._wrap(new.CollectiveRecorder(Path(tmp) / "new", 0, 1, 0), "all_reduce", noop),
        }
        t = torch.ones(128, 64)
        times: dict[str, list[float]] = {k: [] for k in variants}
        loads = [os.getloadavg()[0]]
        for _ in range(args.blocks):
            for name, fn in variants.items():
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fn(t)
                times[name].append((time.perf_counter() - t0) / args.calls * 1e6)
        loads.append(os.getloadavg()[0])
    for how, pick in (("median", statistics.median), ("fastest", min)):  # fastest: the block least preempted
        bare = pick(times["bare"])
        old_us, new_us = pick(times["old"]) - bare, pick(times["new"]) - bare
        print(
            f"per logged call ({how} of {args.blocks} alternating blocks of {args.calls}): {args.against} "
            f"+{old_us:.2f} us, this checkout +{new_us:.2f} us: {old_us / new_us:.2f}x less"
        )
    print(f"load average (1 min) {min(loads):.2f}-{max(loads):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

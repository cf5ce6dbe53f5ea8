"""Doctor costs: runtime overhead per step and static-analysis throughput, each against a peer.

1. Median step time of examples/digits_cnn.py under the doctor's observers vs under the bare
   runtime (the peer: what `scalpel profile --profile-steps 0` measures), interleaved, same process.
2. `scalpel doctor --static` over torch's own Python sources vs the floor: `ast.parse` of the same
   files (the peer), same process.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/doctor_overhead.py --rounds 3
"""

from __future__ import annotations

import argparse
import ast
import statistics
import time
from pathlib import Path

import torch

from torchscalpel.doctor.api import run_rules
from torchscalpel.doctor.catalogue import runtime_rules
from torchscalpel.doctor.options import DoctorOptions
from torchscalpel.doctor.static_scan import analyze_source
from torchscalpel.runtime.target import Target

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_cnn.py"


def step_ms(with_doctor: bool, steps: int) -> float:
    rules = runtime_rules() if with_doctor else []
    window = DoctorOptions(steps=steps, warmup=3).runtime(steps=steps, out_dir=None, name="bench")
    record, _ = run_rules(Target(script=EXAMPLE, args=["--epochs", "3"]), rules, window)
    return float(record.summary["median_step_ms"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bare, doctor = [], []
    for _ in range(args.rounds):  # interleaved: load changes hit both alike
        bare.append(step_ms(False, args.steps))
        doctor.append(step_ms(True, args.steps))
    b, d = statistics.median(bare), statistics.median(doctor)
    print(f"digits_cnn median step: bare runtime {b:.2f} ms, doctor {d:.2f} ms, ratio {d / b:.2f}x")

    files = sorted(Path(torch.__file__).parent.rglob("*.py"))
    texts = [(str(f), f.read_text(encoding="utf-8", errors="replace")) for f in files]
    lines = sum(t.count("\n") for _, t in texts)
    t0 = time.perf_counter()
    for name, text in texts:
        try:
            ast.parse(text, filename=name)
        except SyntaxError:
            pass
    parse_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = sum(len(analyze_source(text, name)) for name, text in texts)
    static_s = time.perf_counter() - t0
    print(
        f"static over torch/: {len(files)} files, {lines:,} lines, {n} findings: doctor {static_s:.1f} s "
        f"({lines / static_s:,.0f} lines/s), ast.parse alone {parse_s:.1f} s, ratio {static_s / parse_s:.1f}x"
    )


if __name__ == "__main__":
    main()

"""Issue 39's residue in the figures, each beside its witness in one run.

For each fixture of tests/fixtures/witness (a gcn-style full-batch loop with ``test()`` forwards after every
step, the same on a sparse adjacency, an LBFGS closure loop with a prediction after every step, and a
word_language_model-style 2-layer ``nn.LSTM``), ``scalpel profile --warmup 1 --steps 6 --profile-steps 1``:
the record's FLOPs per step against ``torch.utils.flop_counter.FlopCounterMode`` over exactly one training step
of the same script in this process (for the LSTM, over the same recurrence written with ``nn.Linear``, as
FlopCounterMode counts nothing for the fused kernel), the evaluation FLOPs kept apart, the ops named as having
no formula, and FLOP/s over the step's training time against over the whole step.

    python benchmarks/flops_residue.py [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WITNESS = REPO / "tests" / "fixtures" / "witness"
CASES = (
    ("gcn + test() each step", "gcn_eval", []),
    ("gcn, sparse adjacency", "gcn_eval", ["--sparse"]),
    ("LBFGS closure + prediction", "seq_eval", []),
    ("2-layer nn.LSTM LM", "lstm_lm", []),
)


def _fixture(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_bench", WITNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _witness(name: str, argv: list[str], step: int) -> int:
    fixture = _fixture(name)
    if name == "seq_eval":
        return fixture.counted_flops(argv, step)
    if name == "lstm_lm":
        return fixture.counted_flops([*argv, "--by-hand"])
    return fixture.counted_flops(argv)


def case(label: str, name: str, argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "torchscalpel",
            "profile",
            "--out",
            str(out),
            "--warmup",
            "1",
            "--steps",
            "6",
        ]
        cmd += ["--profile-steps", "1", "--no-report", "--", str(WITNESS / f"{name}.py"), *argv]
        done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, check=False)
        if done.returncode:
            return {"case": label, "error": done.stderr[-400:]}
        record = json.loads((out / "run.json").read_text())
    summary, profiler = record["summary"], record["profiler"]
    witness = _witness(name, argv, profiler["flops_step"])
    whole = summary["flops_per_step"] / (summary["median_step_ms"] / 1000.0)
    return {
        "case": label,
        "recorded": summary["flops_per_step"],
        "witness": witness,
        "ratio": summary["flops_per_step"] / witness,
        "eval_flops": summary.get("eval_flops"),
        "uncounted": summary.get("flops_uncounted", []),
        "flops_per_s": summary["achieved_flops_per_s"],
        "flops_per_s_whole_step": whole,
        "median_step_ms": summary["median_step_ms"],
        "training_step_ms": summary.get("training_step_ms"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rows = [case(*c) for c in CASES]
    print(f"{platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.1f}")
    print(
        "| run | recorded FLOPs/step | witness | ratio | evaluation FLOPs apart | no formula (share) | FLOP/s (whole step) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | failed: {r['error']} |")
            continue
        named = ", ".join(f"{u['name']} {100 * u['share']:.1f}%" for u in r["uncounted"]) or "-"
        print(
            f"| {r['case']} | {r['recorded']:,.0f} | {r['witness']:,} | {r['ratio']:.4f} | "
            f"{r['eval_flops'] or 0:,.0f} | {named} | {r['flops_per_s'] / 1e9:.2f} G "
            f"({r['flops_per_s_whole_step'] / 1e9:.2f} G) |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

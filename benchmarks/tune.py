"""Benchmark for `scalpel tune` on examples/char_transformer.py or digits_cnn.py (BENCHMARKS.md, "scalpel tune").

1. Runs `scalpel tune` on the example (the whole search: baseline, knobs, combination, near-ties
   stacked on the winner, confirmation; trials measure at least 2 s of steps, tune's default).
2. Re-measures its recommendation independently: baseline and tuned settings run alternately for
   --rounds rounds, each a fresh trial process with the same seed; the figure is the median of the
   per-round ratios baseline/tuned (each ratio from two runs made back to back, so machine load
   drifting between rounds cancels), with every round's numbers printed. Each run measures at
   least --min-measure seconds of steps (a calibration baseline run sets the count).

    OMP_NUM_THREADS=1 python benchmarks/tune.py --budget 10m --rounds 5 [--script digits_cnn]

OMP_NUM_THREADS=1 pins both sides to one thread (the 2 cores are shared with other jobs); the
threads knob is left out for the same reason, so the speedup comes from the other knobs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from torchscalpel.runtime.target import Target  # noqa: E402
from torchscalpel.tune.runner import run_trial  # noqa: E402
from torchscalpel.tune.settings import TuneSettings, read_settings_file  # noqa: E402
from torchscalpel.tune.verify import loss_deviation  # noqa: E402

SCRIPTS = {
    "char_transformer": ["--steps", "400", "--log-every", "1000"],
    "digits_cnn": ["--epochs", "20", "--log-every", "100000"],
}
"""Example scripts and the arguments that give them enough steps for every trial."""


def machine() -> dict[str, object]:
    """CPU model, bf16 flags and load average: the context every figure needs (the CPU is shared)."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from torchscalpel.tune.facts import cpu_flags

    flags = sorted(f for f in cpu_flags() if f in ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f"))
    return {"cpu": model, "cores": os.cpu_count(), "bf16_flags": flags, "loadavg": os.getloadavg()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script", choices=sorted(SCRIPTS), default="char_transformer")
    p.add_argument("--budget", default="10m")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=15, help="measured steps per re-measurement run (at least)")
    p.add_argument(
        "--min-measure",
        type=float,
        default=3.0,
        help="seconds of measured steps per re-measurement run: a calibration baseline run sets "
        "the step count to max(--steps, seconds / its step time); 0 keeps --steps",
    )
    p.add_argument("--knobs", default="amp,dataloader,optimizer,compile,channels_last")
    p.add_argument(
        "--target",
        type=Path,
        default=None,
        help="any script instead of an example (held-out checks: tests/fixtures/corpus/...)",
    )
    p.add_argument("--target-args", default="", help="the --target script's arguments, one string")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--config", type=Path, default=None, help="skip the search: re-measure this scalpel.toml")
    p.add_argument(
        "--device", default=None, help="passed to the example as --device (default: its own choice)"
    )
    args = p.parse_args()
    if args.target is not None:
        script, script_args = args.target.resolve(), shlex.split(args.target_args)
    else:
        script = REPO / "examples" / f"{args.script}.py"
        script_args = [*SCRIPTS[args.script], *(["--device", args.device] if args.device else [])]
    before = machine()
    print(f"machine: {before}", flush=True)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-tune-"))
    env = dict(
        os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")
    )
    config = args.config
    if config is None:
        config = out / "scalpel.toml"
        cmd = [
            sys.executable,
            "-m",
            "torchscalpel",
            "tune",
            "--budget",
            args.budget,
            "--knobs",
            args.knobs,
            "--out",
            str(out / "tune"),
            "--config",
            str(config),
            "--",
            str(script),
            *script_args,
        ]
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, env=env, check=True)
    settings = read_settings_file(config)
    print(f"re-measuring: {settings.label()} vs baseline, {args.rounds} interleaved rounds", flush=True)
    if settings.is_baseline():
        print("tune recommended no change; nothing to re-measure")
        return 0
    os.environ.update(env)

    target = Target(script=script, args=script_args)
    steps = args.steps
    if args.min_measure > 0:
        # Short steps (digits_cnn: ~15 ms) timed over 15 steps are noise: measure seconds, not steps.
        cal = run_trial(
            target,
            TuneSettings(),
            out / "remeasure" / "calibrate",
            warmup=3,
            steps=args.steps,
            seed=0,
            timeout_s=600,
            family="baseline",
        )
        if cal.ok and cal.median_ms:
            steps = max(
                args.steps, min(400, -(-int(args.min_measure * 1000) // int(max(1.0, cal.median_ms))))
            )
    print(f"re-measure runs: 3 warm-up + {steps} measured steps each", flush=True)
    rows = []
    for r in range(args.rounds):
        pair = {}
        for name, s in (("baseline", TuneSettings()), ("tuned", settings)):
            res = run_trial(
                target,
                s,
                out / "remeasure" / f"{r}-{name}",
                warmup=3,
                steps=steps,
                seed=0,
                timeout_s=600,
                family=name,
            )
            if not res.ok:
                print(f"round {r} {name} failed: {res.cause}")
                return 1
            pair[name] = res
        ratio = pair["baseline"].median_ms / pair["tuned"].median_ms
        dev, _ = loss_deviation(pair["baseline"].losses, pair["tuned"].losses, steps=10)
        rows.append(
            {
                "round": r,
                "baseline_ms": pair["baseline"].median_ms,
                "tuned_ms": pair["tuned"].median_ms,
                "ratio": ratio,
                "loss_dev": dev,
            }
        )
        print(
            f"round {r}: baseline {pair['baseline'].median_ms:.1f} ms  tuned {pair['tuned'].median_ms:.1f} ms  "
            f"ratio {ratio:.2f}x  loss dev {dev:.1e}",
            flush=True,
        )
    flags = before.get("bf16_flags") or []
    summary = {
        # The CPU targets lean on bf16 autocast; without native bf16 the amp knob skips itself.
        "bf16_targets": "applicable"
        if {"avx512_bf16", "amx_bf16"} & set(flags)
        else "not applicable: no avx512_bf16 / amx_bf16 on this CPU (the amp knob is skipped with that reason)",
        "script": str(args.target) if args.target else args.script,
        "machine_before": before,
        "machine_after": machine(),
        "settings": settings.to_dict(),
        "measured_steps": steps,
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "min_ratio": min(r["ratio"] for r in rows),
        "baseline_ms_median": statistics.median(r["baseline_ms"] for r in rows),
        "tuned_ms_median": statistics.median(r["tuned_ms"] for r in rows),
        "rounds": rows,
    }
    (out / "bench-tune.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=1))
    print(f"results: {out / 'bench-tune.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

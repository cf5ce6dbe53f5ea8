"""Benchmark for `scalpel fix --verify` on the corpus (BENCHMARKS.md, "scalpel fix: the patched script").

For each corpus script (tests/fixtures/corpus/):

1. `scalpel tune` finds its winner (its confirmed ratio: the lower-median of --confirm interleaved
   pairs, and the spread over them; tune/speedup.py);
2. `scalpel fix RUN --verify` patches a copy of the script and times the original and the patched
   copy in turn under plain python (--pairs interleaved pairs of fresh processes, --steps optimizer
   steps each after 3 warm-up steps; fix/verify_tune.py), the same ratio definition;
3. the row: script, the knob(s) tune kept (and which fix patched), tune's confirmed ratio (spread), the
   patched-vs-original ratio (spread), their difference, and fix's verdict.

Results go to OUT/results.json as each script finishes, and a script already there is skipped (rerun
it with --redo): an interrupted run resumes where it stopped. The CPU model and the load average are
printed first and on every row (the figures mean little on a loaded machine).

    OMP_NUM_THREADS=1 python benchmarks/fix_patched.py --out /tmp/fix-bench \\
        [--scripts nanogpt_style,mingpt_trainer] [--script 'PATH ARGS'] [--pairs 3] [--steps 10] \
        [--budget 4m] [--knobs ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

CORPUS = REPO / "tests" / "fixtures" / "corpus"
SCRIPTS = (
    "nanogpt_style",
    "mingpt_trainer",
    "checkpoint_nonreentrant",
    "closure_sgd",
    "lstm_manual_sgd",
    "accelerate_loop",
    "hf_trainer",
    "lightning_auto",
)
"""Corpus scripts in the default order: the plain loops first (tune and fix are cheapest there)."""


def machine() -> dict[str, Any]:
    """CPU model, cores and load average: the context every figure needs."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model or "unknown",
        "cores": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def run_tune(script: Path, script_args: list[str], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`scalpel tune` on ``script`` into ``out``; its tune section (empty when it wrote no record)."""
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel",
        "tune",
        "--budget",
        args.budget,
        "--confirm",
        str(args.confirm),
    ]
    cmd += ["--knobs", args.knobs] if args.knobs else []
    cmd += ["--out", str(out), "--config", str(out / "scalpel.toml"), "--", str(script), *script_args]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with (out.parent / f"{out.name}.log").open("w", encoding="utf-8") as log:
        subprocess.run(cmd, cwd=out.parent, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    try:
        record = json.loads((out / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return dict((record.get("sections") or {}).get("tune") or {})


def run_fix(run: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`scalpel fix RUN --verify` in this process (the re-runs are fresh processes): the row's figures."""
    from torchscalpel.errors import ScalpelError, UsageError
    from torchscalpel.fix.options import FixOptions
    from torchscalpel.stages.fix import run as run_fix

    try:
        result = run_fix(FixOptions(run_dirs=(run,), verify=True, pairs=args.pairs, steps=args.steps))
    except (UsageError, ScalpelError) as exc:
        return {"error": str(exc)}
    row: dict[str, Any] = {
        "patched": [i.label for i in result.items if i.status == "patched"],
        "not_patched": [f"{i.label}: {i.reason}" for i in result.items if i.status == "not patched"],
    }
    v = result.verification
    if v is None:
        row["error"] = "no diff to verify"
        return row
    s = v.speedup
    row.update(
        plain_rc=v.plain_rc,
        patched_ratio=None if s is None else s.ratio,
        patched_spread=None if s is None or s.low is None else [s.low, s.high],
        patched_ms=None if s is None else [s.baseline_ms, s.candidate_ms],
        verdict="verified" if v.ok else "NOT verified",
        judged=None if v.judgement is None else v.judgement.reason,
        notes=[n for n in v.notes if not n.startswith("copies in")],
    )
    return row


def _ratio(value: Any, spread: Any) -> str:
    if value is None:
        return "not measured"
    return f"{value:.2f}x" + (f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread else " (spread not measured)")


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    """The markdown table of every result so far."""
    lines = [
        "| script | knob(s) tune kept / fix patched | tune confirmed (spread) | patched vs original, plain python (spread) | difference | verdict | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        tune, fixed = r.get("tune", {}), r.get("fix", {})
        kept = tune.get("label") or "no winner"
        patched = ", ".join(fixed.get("patched") or []) or "-"
        a, b = tune.get("ratio"), fixed.get("patched_ratio")
        diff = f"{b - a:+.2f}x" if a is not None and b is not None else "not measured"
        verdict = fixed.get("verdict") or fixed.get("error") or tune.get("why") or "-"
        lines.append(
            f"| {name} | {kept} / {patched} | {_ratio(a, tune.get('spread'))} | "
            f"{_ratio(b, fixed.get('patched_spread'))} | {diff} | {verdict} | {r.get('load', '?')} |"
        )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="results folder (results.json, tune runs, logs)")
    p.add_argument(
        "--scripts", default=",".join(SCRIPTS), help="comma-separated corpus script names ('' for none)"
    )
    p.add_argument(
        "--script",
        action="append",
        default=[],
        metavar="'PATH [ARGS]'",
        help="also a script outside the corpus, with its arguments (shell-quoted; repeatable), e.g. "
        "'tests/fixtures/tune/tiny_train.py --steps 60 --slow-unfused 30' (a known winner: fused)",
    )
    p.add_argument("--pairs", type=int, default=3, help="fix --verify pairs (original, patched)")
    p.add_argument("--steps", type=int, default=10, help="fix --verify optimizer steps timed per run")
    p.add_argument("--budget", default="4m", help="scalpel tune --budget per script")
    p.add_argument("--confirm", type=int, default=3, help="scalpel tune --confirm pairs")
    p.add_argument("--knobs", default="", help="scalpel tune --knobs (default: all)")
    p.add_argument("--redo", action="store_true", help="rerun scripts already in results.json")
    args = p.parse_args()

    from torchscalpel.tune.speedup import speedup_of

    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "results.json"
    results: dict[str, dict[str, Any]] = json.loads(store.read_text()) if store.is_file() else {}
    info = machine()
    print(f"machine: CPU {info['cpu']}, {info['cores']} cores, load average {info['loadavg']}", flush=True)
    jobs = [(n.strip(), CORPUS / f"{n.strip()}.py", []) for n in args.scripts.split(",") if n.strip()]
    for spec in args.script:
        path, *rest = shlex.split(spec)
        jobs.append((Path(path).stem, Path(path).resolve(), rest))
    for name, script, script_args in jobs:
        if not script.is_file():
            print(f"{name}: no such corpus script ({script})", file=sys.stderr)
            return 2
        if name in results and not args.redo:
            print(f"{name}: done before (results.json); --redo to measure again", flush=True)
            continue
        started = time.monotonic()
        run = args.out / f"tune-{name}"
        tune = run_tune(script, script_args, run, args)
        winner = tune.get("winner")
        row: dict[str, Any] = {
            "load": machine()["loadavg"][0],
            "options": {k: getattr(args, k) for k in ("knobs", "budget", "confirm", "pairs", "steps")},
            "args": script_args,
        }
        if not winner:
            why = tune.get("no_candidate") or "; ".join(tune.get("notes") or []) or "tune wrote no record"
            row["tune"] = {"label": None, "ratio": None, "why": f"no winner: {why}"[:160]}
        else:
            s = speedup_of(winner)
            row["tune"] = {
                "label": winner.get("label"),
                "ratio": s.ratio,
                "spread": None if s.low is None else [s.low, s.high],
            }
            row["fix"] = run_fix(run, args)
        row["seconds"] = round(time.monotonic() - started)
        results[name] = row
        store.write_text(json.dumps(results, indent=1), encoding="utf-8")
        print(table({name: row})[-1], flush=True)
    print()
    print(f"machine: CPU {info['cpu']}, {info['cores']} cores, load average now {machine()['loadavg']}")
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

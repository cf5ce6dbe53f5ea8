"""``scalpel lr`` against Lightning's ``Tuner.lr_find`` on the same three models (issue 32).

Each corpus model (benchmarks/lr_corpus: an MLP classifier with SGD+momentum, a small CNN and a tiny
causal transformer LM with Adam, synthetic data, one seed) runs twice, each in a fresh process: the
plain loop under ``scalpel lr`` and the LightningModule under ``Tuner.lr_find``, with the same
--min/--max/--steps. Printed per model: both suggestions and their ratio, and each rule applied to the
other's curve (scalpel's slope is per ln(lr), before the smoothed minimum; Lightning 2.x's is per lr).

python benchmarks/lr_finder.py [--steps 100] [--min 1e-7] [--max 10] [--models mlp,cnn,lm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "lr_corpus"
sys.path.insert(0, str(ROOT / "src"))

from torchscalpel.lrfind.sweep import suggest  # noqa: E402


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def scalpel_lr(kind: str, args: argparse.Namespace, out: Path) -> dict:
    """``scalpel lr`` on the plain loop; its ``sections["lr"]``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torchscalpel", "lr", "--min", str(args.min), "--max", str(args.max)]
    cmd += [
        "--steps",
        str(args.steps),
        "--out",
        str(out),
        "--no-report",
        "--",
        str(CORPUS / "plain.py"),
        kind,
    ]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads((out / "run.json").read_text())["sections"]["lr"]


def lightning(kind: str, args: argparse.Namespace) -> dict:
    """Tuner.lr_find on the LightningModule version, in its own process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(CORPUS / "lightning_version.py"), kind]
    cmd += ["--min", str(args.min), "--max", str(args.max), "--steps", str(args.steps)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(kind: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ours = scalpel_lr(kind, args, Path(tmp) / "lr")
    theirs = lightning(kind, args)
    pts = [p for p in ours["points"] if p["smoothed"] is not None]
    lrs, smoothed = [p["lr"] for p in pts], [p["smoothed"] for p in pts]
    lightning_rule_on_ours = suggest(lrs, smoothed, axis="linear", descent_only=False)
    finite = [(lr, loss) for lr, loss in zip(theirs["lr"], theirs["loss"], strict=False) if loss == loss]
    our_rule_on_theirs = suggest([a for a, _ in finite], [b for _, b in finite]) if finite else None
    return {
        "model": kind,
        "scalpel": (ours["suggestion"] or {}).get("lr"),
        "lightning": theirs["suggestion"],
        "lightning_rule_on_scalpel_curve": lightning_rule_on_ours.lr if lightning_rule_on_ours else None,
        "scalpel_rule_on_lightning_curve": our_rule_on_theirs.lr if our_rule_on_theirs else None,
        "scalpel_points": len(ours["points"]),
        "lightning_points": len(theirs["loss"]),
        "scalpel_diverged_at": (ours["divergence"] or {}).get("lr"),
    }


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "not measured: no suggestion"
    return f"{max(a, b) / min(a, b):.2f}x"


def fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--min", type=float, default=1e-7)
    parser.add_argument("--max", type=float, default=10.0)
    parser.add_argument("--models", default="mlp,cnn,lm")
    args = parser.parse_args()
    print(
        f"{cpu_name()}, torch {__import__('torch').__version__}, lightning {__import__('lightning').__version__}"
    )
    print(f"sweep {args.min:g} -> {args.max:g} over {args.steps} steps")
    print(
        "| model | scalpel lr | Tuner.lr_find | ratio | Lightning's rule on scalpel's curve | ratio to Tuner.lr_find "
        "| scalpel's rule on Lightning's curve | ratio to scalpel lr | points (scalpel / Lightning) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in args.models.split(","):
        r = compare(kind, args)
        print(
            f"| {kind} | {fmt(r['scalpel'])} | {fmt(r['lightning'])} | {ratio(r['scalpel'], r['lightning'])} "
            f"| {fmt(r['lightning_rule_on_scalpel_curve'])} | {ratio(r['lightning_rule_on_scalpel_curve'], r['lightning'])} "
            f"| {fmt(r['scalpel_rule_on_lightning_curve'])} | {ratio(r['scalpel_rule_on_lightning_curve'], r['scalpel'])} "
            f"| {r['scalpel_points']} / {r['lightning_points']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

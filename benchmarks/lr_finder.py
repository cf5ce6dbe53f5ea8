"""``scalpel lr`` against Lightning's ``Tuner.lr_find`` on the same three models (issue 32).

Each corpus model (benchmarks/lr_corpus: an MLP classifier with SGD+momentum, a small CNN and a tiny
causal transformer LM with Adam, synthetic data, one seed) runs twice, each in a fresh process: the
plain loop under ``scalpel lr`` and the LightningModule under ``Tuner.lr_find``, with the same
--min/--max/--steps. Printed per model: both suggestions and their ratio, and each rule applied to the
other's curve (scalpel's slope is per ln(lr), before the smoothed minimum; Lightning 2.x's is per lr).

Then the test a user would run: each model trained for ``--train-steps`` steps at scalpel's suggested lr,
at "minimum / 10" (fastai's other rule, on scalpel's curve: ``sweep.min_over_10``) and at Lightning's,
from the same initialisation and the same batches per seed (``--seeds``: the seed sets the initialisation
and the batch order), with plain.py's loop (the 50-step warm-up LambdaLR, then the lr held). Printed per model and lr: the held-out loss after training (a data
set drawn apart from the training set) per seed and its mean, and how many seeds diverged (a loss that is
not finite). For reference, the same training at a grid of fixed lrs (``--grid``): the best lr a user
would find by trying, and where each suggestion lands against it. ``--no-lightning`` skips Lightning
(its sweep and its training row); ``--grid ''`` skips the grid.

python benchmarks/lr_finder.py [--steps 100] [--min 1e-7] [--max 10] [--models mlp,cnn,lm]
                               [--train-steps 500] [--seeds 0,1,2] [--grid 1e-5,1e-4,1e-3,1e-2,1e-1,1]
                               [--no-lightning]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "lr_corpus"
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from torchscalpel.lrfind.sweep import min_over_10, suggest  # noqa: E402


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
    theirs = lightning(kind, args) if args.lightning else {"lr": [], "loss": [], "suggestion": None}
    pts = [p for p in ours["points"] if p["smoothed"] is not None]
    lrs, smoothed = [p["lr"] for p in pts], [p["smoothed"] for p in pts]
    lightning_rule_on_ours = suggest(lrs, smoothed, axis="linear", descent_only=False)
    minimum = min_over_10(lrs, smoothed)
    finite = [(lr, loss) for lr, loss in zip(theirs["lr"], theirs["loss"], strict=False) if loss == loss]
    our_rule_on_theirs = suggest([a for a, _ in finite], [b for _, b in finite]) if finite else None
    return {
        "model": kind,
        "scalpel": (ours["suggestion"] or {}).get("lr"),
        "lightning": theirs["suggestion"],
        "min_over_10": minimum[1] if minimum else None,
        "lightning_rule_on_scalpel_curve": lightning_rule_on_ours.lr if lightning_rule_on_ours else None,
        "scalpel_rule_on_lightning_curve": our_rule_on_theirs.lr if our_rule_on_theirs else None,
        "scalpel_points": len(ours["points"]),
        "lightning_points": len(theirs["loss"]),
        "scalpel_diverged_at": (ours["divergence"] or {}).get("lr"),
    }


HELD_OUT_BATCHES = 20


def train_at(kind: str, lr: float, seed: int, steps: int, batches: int) -> tuple[float, float]:
    """plain.py's loop for ``steps`` steps at ``lr`` (warm-up LambdaLR, then held): (last train loss, held-out loss)."""
    sys.path.insert(0, str(CORPUS))
    import models

    torch.manual_seed(seed)
    model = {"mlp": models.MLP, "cnn": models.SmallCNN, "lm": models.TinyLM}[kind]()
    optimizer = models.make_optimizer(kind, model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 50))
    data, held = models.make_split(kind, batches, HELD_OUT_BATCHES * models.BATCH)
    order = torch.Generator().manual_seed(seed)
    loss = torch.tensor(float("nan"))
    done = 0
    while done < steps:
        loader = torch.utils.data.DataLoader(data, batch_size=models.BATCH, shuffle=True, generator=order)
        for batch in loader:
            optimizer.zero_grad()
            loss = models.loss_of(kind, model, batch)
            loss.backward()
            optimizer.step()
            scheduler.step()
            done += 1
            if done >= steps or not torch.isfinite(loss):
                break
        if not torch.isfinite(loss):
            break
    with torch.no_grad():
        model.eval()
        test = (
            models.loss_of(kind, model, held.tensors) if torch.isfinite(loss) else torch.tensor(float("nan"))
        )
    return float(loss.detach()), float(test)


def _trained(
    kind: str, lr: float, seeds: list[int], args: argparse.Namespace
) -> tuple[str, float | None, str, str]:
    """(per-seed held-out losses, their mean over the finite ones, the mean as text, diverged count)."""
    losses = [train_at(kind, lr, seed, args.train_steps, args.steps)[1] for seed in seeds]
    finite = [x for x in losses if math.isfinite(x)]
    mean = sum(finite) / len(finite) if finite else None
    per = ", ".join(f"{x:.4f}" if math.isfinite(x) else "nan" for x in losses)
    shown = f"{mean:.4f}" if mean is not None else "not measured: every seed diverged"
    return per, mean, shown, f"{len(losses) - len(finite)} of {len(losses)}"


def training_table(results: list[dict], args: argparse.Namespace) -> None:
    """Each model trained at each suggestion and at the grid: held-out loss per seed, the mean, the diverged runs."""
    seeds = [int(s) for s in args.seeds.split(",")]
    grid = [float(x) for x in args.grid.split(",")] if args.grid else []
    print(
        f"\ntrained {args.train_steps} steps from each lr (plain.py's loop: 50-step warm-up, then held), "
        f"seeds {args.seeds}; held-out loss after training (lower is better; nan: diverged)"
    )
    print("| model | lr from | lr | held-out loss per seed | mean | diverged |")
    print("|---|---|---|---|---|---|")
    verdicts = []
    for r in results:
        kind = r["model"]
        means: dict[str, tuple[float, float | None]] = {}
        rows = [("scalpel lr", r["scalpel"]), ("minimum / 10", r["min_over_10"])]
        if args.lightning:
            rows.append(("Tuner.lr_find", r["lightning"]))
        rows += [("grid", lr) for lr in grid if lr not in (r["scalpel"], r["lightning"], r["min_over_10"])]
        for label, lr in rows:
            if not lr:
                print(f"| {kind} | {label} | none | not measured: no suggestion | | |")
                continue
            per, mean, shown, diverged = _trained(kind, lr, seeds, args)
            means[f"{label} {lr:.3g}"] = (lr, mean)
            print(f"| {kind} | {label} | {lr:.3g} | {per} | {shown} | {diverged} |", flush=True)
        finite = {k: v for k, v in means.items() if v[1] is not None}
        if finite:
            best = min(finite, key=lambda k: finite[k][1])  # type: ignore[arg-type,return-value]
            ours = next((v[1] for k, v in means.items() if k.startswith("scalpel")), None)
            theirs = next((v[1] for k, v in means.items() if k.startswith("Tuner")), None)
            tenth = next((v[1] for k, v in means.items() if k.startswith("minimum")), None)
            verdicts.append(
                f"{kind}: lowest mean at {best} ({finite[best][1]:.4f}); scalpel's pick "
                f"{'not measured' if ours is None else f'{ours:.4f}'}, minimum / 10 "
                f"{'not measured' if tenth is None else f'{tenth:.4f}'}, Tuner.lr_find's "
                f"{'not measured' if theirs is None else f'{theirs:.4f}'}"
            )
    for line in verdicts:
        print(line)


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
    parser.add_argument(
        "--train-steps", type=int, default=500, help="steps trained at each suggestion (0: skip)"
    )
    parser.add_argument(
        "--seeds", default="0,1,2", help="initialisation and batch-order seeds of the training runs"
    )
    parser.add_argument(
        "--grid", default="1e-5,1e-4,1e-3,1e-2,1e-1,1", help="fixed lrs trained for reference ('' to skip)"
    )
    parser.add_argument(
        "--no-lightning",
        dest="lightning",
        action="store_false",
        help="skip Tuner.lr_find (its sweep and its training row): scalpel's picks only",
    )
    args = parser.parse_args()
    lightning_version = __import__("lightning").__version__ if args.lightning else "not run"
    print(f"{cpu_name()}, torch {__import__('torch').__version__}, lightning {lightning_version}")
    print(f"sweep {args.min:g} -> {args.max:g} over {args.steps} steps")
    print(
        "| model | scalpel lr | Tuner.lr_find | ratio | Lightning's rule on scalpel's curve | ratio to Tuner.lr_find "
        "| scalpel's rule on Lightning's curve | ratio to scalpel lr | points (scalpel / Lightning) | minimum / 10 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for kind in args.models.split(","):
        r = compare(kind, args)
        results.append(r)
        print(
            f"| {kind} | {fmt(r['scalpel'])} | {fmt(r['lightning'])} | {ratio(r['scalpel'], r['lightning'])} "
            f"| {fmt(r['lightning_rule_on_scalpel_curve'])} | {ratio(r['lightning_rule_on_scalpel_curve'], r['lightning'])} "
            f"| {fmt(r['scalpel_rule_on_lightning_curve'])} | {ratio(r['scalpel_rule_on_lightning_curve'], r['scalpel'])} "
            f"| {r['scalpel_points']} / {r['lightning_points']} | {fmt(r['min_over_10'])} |",
            flush=True,
        )
    if args.train_steps > 0:
        torch.set_num_threads(1)
        training_table(results, args)


if __name__ == "__main__":
    main()

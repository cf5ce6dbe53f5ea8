"""Benchmark: tune's answer end to end through the user's own script (BENCHMARKS.md, "tune end to end").

For each loop (two library-model loops: a tiny transformers Llama trained with the config's defaults and a
tiny transformers BERT classifier fine-tuned through a DataLoader; and a corpus-style loop):

1. ``scalpel tune`` finds its winner (confirmed ratio, pays-back line);
2. a copy of the script in a fresh git project is patched by ``scalpel fix RUN --apply``;
3. a second copy is the **best config found by hand** (:data:`HAND`: what a senior engineer writes on that
   loop, e.g. ``model.config.use_cache = False`` and ``model = torch.compile(model)``);
4. interleaved rounds (original, patched, by hand) under plain python, timed two ways:
   - per step: ``fix/steptimer.py`` (torch's optimizer-step hooks, nothing of torchscalpel; the median of
     the steady steps after ``--warmup``), with the first steps' losses,
   - end to end: the wall time of the whole process for the script's own ``--steps``;
   and beside them ``scalpel run --config SCALPEL.TOML`` on the original script, end to end;
5. the row: tune's confirmed per-step ratio, the patched script's per-step ratio (and how far it is from
   tune's), the hand-written config's, the patched script against the best by hand (the faster of the
   original and the hand copy, in the same round: the acceptance wants >= 0.90), the losses' largest
   relative deviation from the original, and the end-to-end ratios of the patched script, the hand copy
   and ``scalpel run``, against the original in the same round.

When tune recommends nothing (and ``--candidate`` is not given) the original and the hand copy are still
timed: a recommendation of nothing against a 1.5x by hand is a miss to report.

The machine's CPU and load average (``uptime``) are printed first and stored with every row: on a busy
machine the ratios carry the load. Results go to OUT/results.json.

    OMP_NUM_THREADS=1 python benchmarks/tune_end_to_end.py --out /tmp/e2e [--pairs 2] [--budget 6m]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

STEPTIMER = REPO / "src" / "torchscalpel" / "fix" / "steptimer.py"
LOOPS = {
    "llama": (
        REPO / "tests" / "fixtures" / "tune" / "llama_cache.py",
        ["--hidden", "128", "--layers", "4", "--seq", "64", "--batch", "8"],
        "compile,amp",
    ),
    "bert": (
        REPO / "tests" / "fixtures" / "tune" / "bert_classify.py",
        ["--hidden", "128", "--layers", "4", "--seq", "64", "--batch", "16"],
        "compile,amp,optimizer",
    ),
    "nanogpt_style": (
        REPO / "tests" / "fixtures" / "corpus" / "nanogpt_style.py",
        [],
        "compile,amp,optimizer",
    ),
}
"""name -> (script, its arguments without the step count, tune's --knobs)."""
STEP_FLAG = {"llama": "--steps", "bert": "--steps", "nanogpt_style": "--max_iters"}
"""How each script takes its number of steps (nanoGPT's configurator: ``--key=value``)."""
HAND: dict[str, tuple[str, str]] = {
    # what the engineer wrote by hand on the held-out Llama loop: 1.81x per step there
    "llama": (
        "    model.train()\n",
        "    model.config.use_cache = False\n    model = torch.compile(model)\n",
    ),
    # the same recipe on an encoder (BERT builds no cache; the line is what a user copies over all the same)
    "bert": ("    model.train()\n", "    model.config.use_cache = False\n    model = torch.compile(model)\n"),
    # nanoGPT's own --compile uses backend="aot_eager" in this fixture: by hand it is inductor's default
    "nanogpt_style": ("model = GPT().to(device)\n", "model = torch.compile(model)\n"),
}
"""name -> (the line after which, the lines a person inserts): the best config found by hand on that loop."""


def uptime() -> str:
    """``uptime``'s load averages, as the benchmark's context."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def steps_args(name: str, steps: int) -> list[str]:
    flag = STEP_FLAG[name]
    return [f"{flag}={steps}"] if name == "nanogpt_style" else [flag, str(steps)]


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def tune(name: str, script: Path, args: list[str], knobs: str, out: Path, budget: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torchscalpel", "tune", "--budget", budget, "--knobs", knobs]
    cmd += ["--out", str(out), "--config", str(out / "scalpel.toml"), "--", str(script), *args]
    with (out.parent / f"{name}-tune.log").open("w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env(), check=False)
    try:
        return json.loads((out / "run.json").read_text())["sections"]["tune"]
    except (OSError, ValueError, KeyError):
        return {}


def project_copy(script: Path, project: Path) -> Path:
    """``script`` in a git project of its own (what tune runs and fix patches: the user's tree)."""
    if project.exists():
        shutil.rmtree(project)
    project.mkdir(parents=True)
    copy = project / script.name
    shutil.copy(script, copy)
    git = ["git", "-c", "user.email=b@b", "-c", "user.name=b"]
    subprocess.run([*git, "init", "-q", str(project)], check=True)
    subprocess.run([*git, "-C", str(project), "add", "."], check=True)
    subprocess.run([*git, "-C", str(project), "commit", "-qm", "original"], check=True)
    return copy


def patched_copy(copy: Path, run: Path, work: Path) -> tuple[Path, str]:
    """A second copy of the project's script, patched by ``scalpel fix RUN --apply`` in the project (the
    project's own copy is then restored, so the original stays beside the patched one)."""
    project = copy.parent
    fixed = subprocess.run(
        [sys.executable, "-m", "torchscalpel", "fix", str(run), "--apply"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    patched = work / copy.name
    shutil.copy(copy, patched)
    subprocess.run(["git", "-C", str(project), "checkout", "-q", "--", copy.name], check=True)
    return patched, (fixed.stdout + fixed.stderr).strip()


def hand_copy(name: str, script: Path, work: Path) -> Path | None:
    """A copy of ``script`` with :data:`HAND`'s lines inserted by hand (None when the loop has none)."""
    if name not in HAND:
        return None
    after, lines = HAND[name]
    text = script.read_text()
    if text.count(after) != 1:
        raise SystemExit(f"{script.name}: the hand edit's anchor {after.strip()!r} is not there once")
    copy = work / "hand" / script.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(text.replace(after, after + lines))
    return copy


def per_step(
    script: Path | None, args: list[str], warmup: int, steps: int, work: Path
) -> tuple[float | None, list[float]]:
    """Median steady step (ms) of ``script`` under plain python (steptimer: no torchscalpel inside), and
    the first steps' losses."""
    if script is None:
        return None, []
    out = work / f"steps-{time.monotonic_ns()}.json"
    cmd = [sys.executable, str(STEPTIMER), str(out), str(warmup), str(steps), str(script), *args]
    subprocess.run(cmd, cwd=script.parent, capture_output=True, env={**env(), "PYTHONPATH": ""}, check=False)
    try:
        data = json.loads(out.read_text())
        ms = data["step_ms"][warmup:]
    except (OSError, ValueError, KeyError):
        return None, []
    return (statistics.median(ms) if ms else None), [float(v) for v in data.get("losses") or []]


def loss_dev(base: list[float], other: list[float]) -> float | None:
    """Largest relative deviation of ``other``'s losses from ``base``'s, step by step (tune's gate's figure)."""
    pairs = list(zip(base, other, strict=False))
    if not pairs:
        return None
    return max(abs(b - o) / max(abs(b), 1e-12) for b, o in pairs)


def wall(cmd: list[str] | None, cwd: Path, clean: bool) -> float | None:
    """Seconds the whole process took (None when it failed or there is nothing to run)."""
    if cmd is None:
        return None
    start = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, env={**env(), "PYTHONPATH": ""} if clean else env(), check=False
    )
    return time.monotonic() - start if proc.returncode == 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def forced_run(run: Path, section: dict[str, Any], into: Path) -> tuple[Path, dict[str, Any] | None]:
    """A copy of ``run`` whose tune section names tune's best measured candidate as the one to patch."""
    from torchscalpel.tune.apply import code_lines
    from torchscalpel.tune.settings import TuneSettings, write_settings_file

    ran = [t for t in section.get("trials", []) if t.get("status") == "ok" and t.get("speedup")]
    if not ran:
        return run, None
    best = max(ran, key=lambda t: t["speedup"])
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(run, into)
    record = json.loads((into / "run.json").read_text())
    settings = TuneSettings.from_dict(best["settings"])
    record["sections"]["tune"].update(
        winner=best, settings=settings.to_dict(), code_lines=code_lines(settings), forced=True
    )
    (into / "run.json").write_text(json.dumps(record))
    write_settings_file(settings, into / "scalpel.toml", header=["forced by benchmarks/tune_end_to_end.py"])
    return into, best


def median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def time_rounds(
    name: str,
    script: Path,
    patched: Path | None,
    hand: Path | None,
    toml: Path | None,
    args: argparse.Namespace,
    work: Path,
) -> list[dict[str, Any]]:
    """Interleaved rounds: original, patched, by hand (per step, then end to end), and ``scalpel run``."""
    _, base_args, _ = LOOPS[name]
    tune_args = [*base_args, *steps_args(name, args.steps)]
    timer_args = [*base_args, *steps_args(name, args.warmup + args.timed + 5)]

    def plain(path: Path | None) -> list[str] | None:
        return None if path is None else [sys.executable, str(path), *tune_args]

    run_cmd = (
        None
        if toml is None
        else [
            sys.executable,
            "-m",
            "torchscalpel",
            "run",
            "--config",
            str(toml),
            "--",
            str(script),
            *tune_args,
        ]
    )
    rounds = []
    for _ in range(args.pairs):
        o, o_loss = per_step(script, timer_args, args.warmup, args.timed, work)
        q, q_loss = per_step(patched, timer_args, args.warmup, args.timed, work)
        h, h_loss = per_step(hand, timer_args, args.warmup, args.timed, work)
        ow = wall(plain(script), script.parent, True)
        pw = wall(plain(patched), script.parent, True)
        hw = wall(plain(hand), script.parent, True)
        rw = wall(run_cmd, script.parent, False)
        best_hand = min((v for v in (o, h) if v is not None), default=None)
        rounds.append(
            {
                "step_ms": {"original": o, "patched": q, "hand": h},
                "per_step": ratio(o, q),
                "hand_per_step": ratio(o, h),
                "patched_vs_best_hand": ratio(best_hand, q),
                "loss_dev": {"patched": loss_dev(o_loss, q_loss), "hand": loss_dev(o_loss, h_loss)},
                "wall_s": {"original": ow, "patched": pw, "hand": hw, "scalpel_run": rw},
                "patched_end_to_end": ratio(ow, pw),
                "hand_end_to_end": ratio(ow, hw),
                "scalpel_run_end_to_end": ratio(ow, rw),
                "load": uptime(),
            }
        )
        print(json.dumps(rounds[-1]), flush=True)
    return rounds


def summarize(row: dict[str, Any]) -> None:
    """The acceptance figures over the rounds (medians): patched vs tune's own figure, and vs the best by hand."""
    rounds = row.get("rounds") or []
    for key in ("per_step", "hand_per_step", "patched_vs_best_hand", "patched_end_to_end", "hand_end_to_end"):
        row[f"median_{key}"] = median([r.get(key) for r in rounds])
    if row.get("tune_per_step") and row.get("median_per_step"):
        row["patched_vs_tune"] = row["median_per_step"] / row["tune_per_step"]
        row["patched_within_10pct_of_tune"] = abs(row["patched_vs_tune"] - 1.0) <= 0.10
    if row.get("median_patched_vs_best_hand") is not None:
        row["within_10pct_of_best_hand"] = row["median_patched_vs_best_hand"] >= 0.90
    elif row.get("median_hand_per_step") is not None:
        # nothing patched: the original is what tune leaves the user with
        row["original_vs_best_hand"] = min(1.0, 1.0 / row["median_hand_per_step"])
        row["within_10pct_of_best_hand"] = row["original_vs_best_hand"] >= 0.90


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--loops", default=",".join(LOOPS))
    p.add_argument("--budget", default="6m", help="scalpel tune --budget per loop")
    p.add_argument(
        "--knobs", default="", help="scalpel tune --knobs for every loop (default: each loop's own)"
    )
    p.add_argument(
        "--pairs", type=int, default=2, help="interleaved (original, patched, by hand, scalpel run) rounds"
    )
    p.add_argument("--steps", type=int, default=60, help="the script's own steps for the end-to-end runs")
    p.add_argument("--timed", type=int, default=20, help="steps timed per step-timer run, after --warmup")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--candidate",
        action="store_true",
        help="when tune recommends nothing, measure its best measured candidate end to end anyway (said so)",
    )
    p.add_argument("--reuse", action="store_true", help="reuse OUT/tune-NAME instead of running tune again")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "results.json"
    results: dict[str, Any] = json.loads(store.read_text()) if store.is_file() else {}
    print(f"machine: {cpu()}, {os.cpu_count()} cores; {uptime()}", flush=True)
    for name in [n for n in args.loops.split(",") if n]:
        if name not in LOOPS:
            raise SystemExit(f"--loops: no loop {name!r} (known: {', '.join(LOOPS)})")
        original, base_args, knobs = LOOPS[name]
        run = args.out / f"tune-{name}"
        script = original if args.reuse else project_copy(original, args.out / f"project-{name}")
        if args.reuse:
            script = args.out / f"project-{name}" / original.name
        tune_args = [*base_args, *steps_args(name, args.steps)]
        row: dict[str, Any] = {
            "load_before": uptime(),
            "command": shlex.join([str(script), *tune_args]),
            "knobs": args.knobs or knobs,
            "budget": args.budget,
            "hand": HAND.get(name, ("", ""))[1].strip(),
        }
        section = (
            tune(name, script, tune_args, args.knobs or knobs, run, args.budget) if not args.reuse else {}
        )
        if args.reuse:
            section = json.loads((run / "run.json").read_text())["sections"]["tune"]
        winner = section.get("winner")
        row["tune_headline"] = winner and winner.get("label")
        row["tune_notes"] = section.get("notes", [])
        if not winner and args.candidate:
            # tune recommended nothing (a busy machine): measure its best candidate end to end anyway,
            # in a copy of the run whose tune section names it, and say so in the row (never a verdict)
            run, winner = forced_run(run, section, args.out / f"forced-{name}")
            row["forced_candidate"] = winner and winner.get("label")
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            hand = hand_copy(name, script, work)
            patched: Path | None = None
            toml: Path | None = None
            if winner:
                from torchscalpel.tune.speedup import speedup_of

                s = speedup_of(winner)
                row["tune_per_step"] = s.ratio
                row["tune_spread"] = [s.low, s.high]
                row["payback"] = (winner.get("payback") or {}).get("sentence")
                patched, said = patched_copy(script, run, work)
                row["patched_diff"] = subprocess.run(
                    ["diff", "-u", str(script), str(patched)], capture_output=True, text=True, check=False
                ).stdout[-3000:]
                row["fix"] = said.splitlines()[-6:]
                toml = run / "scalpel.toml"
            else:
                row["result"] = "no winner: " + "; ".join(
                    section.get("notes") or [section.get("no_candidate", "")]
                )
            row["rounds"] = time_rounds(name, script, patched, hand, toml, args, work)
        summarize(row)
        row["load_after"] = uptime()
        results[name] = row
        store.write_text(json.dumps(results, indent=1))
        print(json.dumps(row, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

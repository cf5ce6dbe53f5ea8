"""``scalpel tune --fit SIZE``: the fastest configuration whose live tensors stay under SIZE.

The search is the memory ladder, measured: the script runs once under ``scalpel memory --memory-limit
SIZE`` (baseline); when it does not fit, its fix ladder's ``[tune]`` rungs (checkpointing of the repeated
blocks, K micro-batches, bf16 autocast) and the pairs of them are each run the same way, every trial in a
fresh subprocess. A trial fits when it ends without crossing the limit; among those, the one with the
lowest median step time wins and is written to ``scalpel.toml``, so ``scalpel run --memory-limit SIZE
--config scalpel.toml`` reproduces it. Step times are measured under the memory tracker, the same for
every trial, so they rank the trials (their absolute values are above a plain run's).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchscalpel.runtime.target import Target
from torchscalpel.tune.settings import TuneSettings, settings_to_toml, write_settings_file


@dataclass(kw_only=True, slots=True)
class FitOptions:
    """What ``--fit`` needs beyond the target."""

    limit_text: str
    """The size as the user typed it (passed on to ``scalpel memory --memory-limit``)."""
    out_dir: Path
    warmup: int = 1
    steps: int = 5
    timeout_s: float = 900.0


@dataclass(slots=True)
class FitTrial:
    """One measured configuration."""

    settings: TuneSettings
    fits: bool
    step_ms: float | None
    peak: int | None
    error: str | None = None
    section: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "settings": self.settings.to_dict(),
            "label": self.settings.label(),
            "fits": self.fits,
            "step_ms": self.step_ms,
            "peak": self.peak,
            "error": self.error,
        }


def _trial(
    target: Target, settings: TuneSettings, options: FitOptions, index: int, *, plan: bool
) -> FitTrial:
    folder = options.out_dir / f"fit-{index}"
    folder.mkdir(parents=True, exist_ok=True)
    toml = folder / "scalpel.toml"
    toml.write_text(settings_to_toml(settings), encoding="utf-8")
    js = folder / "memory.json"
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel",
        "memory",
        "--memory-limit",
        options.limit_text,
        "--warmup",
        str(options.warmup),
        "--steps",
        str(options.steps),
        "--config",
        str(toml),
        "--out",
        str(folder / "run"),
        "--json",
        str(js),
        "--no-report",
        *([] if plan else ["--no-plan"]),
    ]
    cmd += ["-m", target.module] if target.module else ["--", str(target.script)]
    cmd += list(target.args)
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=options.timeout_s, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return FitTrial(settings, False, None, None, f"no result in {options.timeout_s:.0f} s")
    if not js.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return FitTrial(settings, False, None, None, f"the trial wrote no memory section: {tail[0]}")
    section = json.loads(js.read_text(encoding="utf-8"))
    record = json.loads((folder / "run" / "run.json").read_text(encoding="utf-8"))
    times = [s["total_ms"] for s in record.get("steps", []) if not s.get("warmup")]
    fits = "oom" not in section and record.get("status") in ("complete", "stopped")
    error = None if fits else (record.get("error") or f"status {record.get('status')}")
    return FitTrial(
        settings,
        fits,
        statistics.median(times) if times else None,
        (section.get("peak") or {}).get("total"),
        error,
        section,
    )


def candidates(baseline: FitTrial) -> list[TuneSettings]:
    """The ladder's ``[tune]`` rungs of the baseline's post-mortem, then every pair of them."""
    ladder = (baseline.section.get("oom") or {}).get("ladder", [])
    configs: list[dict[str, Any]] = []
    for rung in ladder:
        if rung.get("config") and rung["config"] not in configs:
            configs.append(rung["config"])
    singles = [TuneSettings.from_dict(c) for c in configs]
    pairs = [a.merged(b) for a, b in itertools.combinations(singles, 2)]
    return [*singles, *pairs]


def fit_search(target: Target, options: FitOptions) -> dict[str, Any]:
    """Measure the baseline and the ladder's candidates; return the trials and the winner (or none)."""
    options.out_dir.mkdir(parents=True, exist_ok=True)
    baseline = _trial(target, TuneSettings(), options, 0, plan=True)
    trials = [baseline]
    if not baseline.fits:
        for i, settings in enumerate(candidates(baseline), start=1):
            trials.append(_trial(target, settings, options, i, plan=False))
    fitting = [t for t in trials if t.fits and t.step_ms is not None]
    winner = min(fitting, key=lambda t: t.step_ms or 0.0) if fitting else None
    return {
        "limit": options.limit_text,
        "trials": [t.to_dict() for t in trials],
        "winner": winner.to_dict() if winner else None,
        "_winner": winner,
    }


def write_winner(result: dict[str, Any], config: Path) -> Path | None:
    """Write the winner's settings to ``config`` (None when nothing fits)."""
    winner: FitTrial | None = result.get("_winner")
    if winner is None:
        return None
    header = [
        f"scalpel tune --fit {result['limit']}: fastest configuration that fits",
        f"check it: scalpel run --memory-limit {result['limit']} --config {config} -- SCRIPT",
    ]
    return write_settings_file(winner.settings, config, header=header)


def run_fit(target: Target, *, limit_text: str, out_dir: Path, config: Path, warmup: int, steps: int) -> int:
    """``scalpel tune --fit SIZE``: search, print the table, write the winner. Exit 0 when something fits, 1 if not."""
    from torchscalpel.units import fmt_bytes, parse_size

    parse_size(limit_text, flag="--fit")  # one sentence and exit 2 for a bad size, before any trial
    result = fit_search(
        target, FitOptions(limit_text=limit_text, out_dir=out_dir, warmup=warmup, steps=steps)
    )
    print(f"scalpel tune --fit {limit_text}: {len(result['trials'])} trial(s)")
    for t in result["trials"]:
        ms = f"{t['step_ms']:.1f} ms/step" if t["step_ms"] is not None else "-"
        state = "fits" if t["fits"] else f"does not fit ({t['error']})"
        print(f"  {t['label']:<40} {fmt_bytes(t['peak']):>11}  {ms:>14}  {state}")
    (out_dir / "fit.json").write_text(
        json.dumps({k: v for k, v in result.items() if not k.startswith("_")}, indent=1) + "\n",
        encoding="utf-8",
    )
    written = None
    if result["winner"] is not None:
        own = not config.exists() or config.read_text(encoding="utf-8").startswith("# scalpel tune")
        written = write_winner(result, config if own else out_dir / "scalpel.toml")
        print(
            f"fastest that fits: {result['winner']['label']}; settings in {written} "
            f"(scalpel run --memory-limit {limit_text} --config {written} -- ...)"
        )
        return 0
    print("nothing fits: see the ladder in " + str(out_dir / "fit-0" / "memory.json"))
    return 1

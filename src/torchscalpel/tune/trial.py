"""One tune trial, run in a fresh process: ``python -m torchscalpel.tune.trial``.

    python -m torchscalpel.tune.trial --settings '{"amp": "bf16"}' --out DIR \\
        --warmup 3 --steps 10 --seed 0 [--facts] [--module-times] -- SCRIPT [ARGS]

Seeds torch (and ``random``/numpy) before the script, applies the settings as runtime setup hooks,
runs the script for ``warmup + steps`` optimizer steps, and writes ``DIR/run.json`` with
``sections["trial"]`` (what each knob did or why it could not, compile statistics, peak memory).
A fresh process per trial means a crash, an OOM or a compile error costs only this trial, and
no compiled code or patched default leaks into the next one.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.runtime.observer import Observer
from torchscalpel.tune.knobs import ApplyLog
from torchscalpel.tune.settings import TuneSettings

if TYPE_CHECKING:
    from torchscalpel.record import RunRecord, StepRecord

TRIAL_SECTION = "trial"


class TrialObserver(Observer):
    """Adds the trial section (settings, apply log, compile stats, peak memory) to the record."""

    name = "tune-trial"

    def __init__(self, settings: TuneSettings, log: ApplyLog, seed: int) -> None:
        self.settings = settings
        self.log = log
        self.seed = seed

        self.compiled_steps: list[dict[str, Any]] = []
        """Steps during which dynamo compiled (index, warm-up or not, seconds, the guard): a compile in a
        measured step is not steady state (:func:`torchscalpel.tune.runner.steady_steps`)."""
        self._compile_s = 0.0
        self._guards = 0

    def on_step_end(self, step: StepRecord) -> None:
        if self.settings.compile is None:
            return
        from torchscalpel.tune.knobs.compile import compile_progress

        seconds, guards, last_guard = compile_progress()
        last = self.compiled_steps[-1] if self.compiled_steps else None
        if (
            last is not None
            and last["index"] == step.index
            and (seconds > self._compile_s + 1e-6 or guards > self._guards)
        ):
            # the same step reported again (the runtime re-emits a step it re-opened): one entry per step
            last["compile_s"] = round(last["compile_s"] + seconds - self._compile_s, 3)
            last["recompiles"] += guards - self._guards
        elif seconds > self._compile_s + 1e-6 or guards > self._guards:
            self.compiled_steps.append(
                {
                    "index": step.index,
                    "warmup": bool(step.warmup),
                    "compile_s": round(seconds - self._compile_s, 3),
                    "recompiles": guards - self._guards,
                    "guard": last_guard if guards > self._guards else "",
                }
            )
        self._compile_s, self._guards = seconds, guards

    def on_finish(self, record: RunRecord) -> None:
        record.sections[TRIAL_SECTION] = trial_section(self.settings, self.log, self.seed)
        if self.settings.compile is not None:
            record.sections[TRIAL_SECTION]["compile"]["compiled_steps"] = self.compiled_steps[:50]


def trial_section(settings: TuneSettings, log: ApplyLog, seed: int) -> dict[str, Any]:
    """What this process measured about the trial beyond the runtime's step timings."""
    section: dict[str, Any] = {
        "settings": settings.to_dict(),
        "label": settings.label(),
        "seed": seed,
        "apply": log.to_dict(),
        # ru_maxrss is KiB on Linux: the process's peak resident memory, the CPU peak we can trust.
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        section["cuda_peak_bytes"] = torch.cuda.max_memory_allocated()
    if settings.compile is not None:
        from torchscalpel.tune.knobs.compile import compile_stats

        section["compile"] = compile_stats()
    return section


def seed_everything(seed: int) -> None:
    """Same seed for every trial: torch (CPU and CUDA), ``random``, and numpy when installed."""
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def build_parser() -> argparse.ArgumentParser:
    """Arguments of the trial entry point (internal: scalpel tune builds the command line)."""
    parser = argparse.ArgumentParser(prog="python -m torchscalpel.tune.trial")
    parser.add_argument("--settings", required=True, help="TuneSettings as JSON")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--facts", action="store_true", help="collect model facts (baseline)")
    parser.add_argument("--module-times", action="store_true", help="time submodule forwards (baseline)")
    parser.add_argument("--step-kind", default="auto")
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="profile this many measured steps (the baseline's facts run: what tune tries first)",
    )
    parser.add_argument("-m", dest="module")
    parser.add_argument("target", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one trial; exit 0 when run.json was written (the script's failure is recorded in it)."""
    from torchscalpel.record import save_record
    from torchscalpel.runtime.session import RuntimeOptions, run_target
    from torchscalpel.runtime.target import Target
    from torchscalpel.tune.apply import setup_hooks
    from torchscalpel.tune.facts import FactsObserver

    args = build_parser().parse_args(argv)
    rest = list(args.target)
    if rest and rest[0] == "--":
        rest = rest[1:]
    target = (
        Target(module=args.module, args=rest) if args.module else Target(script=Path(rest[0]), args=rest[1:])
    )
    settings = TuneSettings.from_dict(json.loads(args.settings))
    log = ApplyLog()
    observers: list[Observer] = [TrialObserver(settings, log, args.seed)]
    if args.facts:
        observers.append(FactsObserver())
    args.out.mkdir(parents=True, exist_ok=True)
    seed_everything(args.seed)
    options = RuntimeOptions(
        warmup=args.warmup,
        steps=args.steps,
        out_dir=args.out,
        profile_steps=args.profile_steps,
        module_times=args.module_times,
        step_kind=args.step_kind,
    )
    record = run_target(target, options, observers=observers, setup_hooks=setup_hooks(settings, log))
    record.sections.setdefault(TRIAL_SECTION, trial_section(settings, log, args.seed))
    save_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``scalpel tune``: measured, numerics-checked speedups applied to an unmodified script.

- :mod:`torchscalpel.tune.knobs`: one knob family per module, each a setup hook with an undo;
- :mod:`torchscalpel.tune.settings`: the knob values and their ``scalpel.toml`` form;
- :mod:`torchscalpel.tune.trial` / :mod:`~torchscalpel.tune.runner`: one trial per fresh process;
- :mod:`torchscalpel.tune.states`: a trial's status and verdict (one enum each);
- :mod:`torchscalpel.tune.verify`: the numerics gate and the speed margin;
- :mod:`torchscalpel.tune.bottleneck`: the baseline's bottleneck class from its record and profile;
- :mod:`torchscalpel.tune.plan`: which candidates, in what order, and why (from that class);
- :mod:`torchscalpel.tune.triage`: compile breaks, recompile guards, a failing function excluded;
- :mod:`torchscalpel.tune.search`: the loop: baseline, single knobs, greedy combination;
- :mod:`torchscalpel.tune.options` / :mod:`~torchscalpel.tune.result`: what it is asked, what it found;
- :mod:`torchscalpel.tune.budget`: time left, each trial's limit, what a confirmation costs;
- :mod:`torchscalpel.tune.ordering`: winners per family, near-ties to stack, the confirmation order;
- :mod:`torchscalpel.tune.confirm`: the interleaved confirmation pairs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchscalpel.runtime.target import Target
    from torchscalpel.tune.search import TuneResult


def tune_stage(
    target: Target,
    out_dir: Path,
    *,
    budget_s: float = 120.0,
    steps: int = 6,
    warmup: int = 2,
    knobs: tuple[str, ...] = ("amp", "threads", "dataloader"),
    quiet: bool = False,
) -> TuneResult:
    """A short tune for ``scalpel demo``: cheap knobs only (no cold compile), results in ``out_dir``.

    Writes run.json, report.html, scalpel.toml and code.txt into ``out_dir`` and prints the table.
    """
    from torchscalpel.tune.console import RichProgress, print_tune_result
    from torchscalpel.tune.outputs import save_outputs
    from torchscalpel.tune.search import SilentProgress, TuneOptions, tune

    options = TuneOptions(
        out_dir=out_dir, budget_s=budget_s, steps=steps, warmup=warmup, knobs=knobs, confirm_pairs=1
    )
    result = tune(target, options, SilentProgress() if quiet else RichProgress())
    save_outputs(
        result,
        out_dir,
        config_path=None,
        command=["scalpel", "demo"],
        target_text=" ".join(str(a) for a in target.argv()),
    )
    if not quiet:
        print_tune_result(result, out_dir=out_dir, config_path=out_dir / "scalpel.toml")
    return result

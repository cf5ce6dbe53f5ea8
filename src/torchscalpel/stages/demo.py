"""``scalpel demo``'s stages: every stage on the bundled example, into one folder and one report.

Stages run in the order of the workflow (env, profile, doctor, analyze, tune, plan, ship); each
writes its own outputs under ``<out>/<stage>/`` and a failing stage is reported without stopping
the others. ``<out>/report.html`` is a table of what every stage did followed by the stage records
(profile, doctor, tune, plan), rendered as ``scalpel report`` renders several records.
``cli/demo.py`` only parses the command line into :class:`DemoOptions` and calls :func:`run`.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from torchscalpel.errors import UsageError
from torchscalpel.fileio import atomic_write_text
from torchscalpel.options import StageOptions
from torchscalpel.report.demo_terminal import result_word
from torchscalpel.runtime.target import Target

if TYPE_CHECKING:
    from torchscalpel.tune.options import TuneOptions

STAGES = ("env", "profile", "doctor", "analyze", "tune", "plan", "ship")
# Sized so every stage together takes a few minutes on a 2-core laptop CPU.
EXAMPLE_ARGS = ["--steps", "200", "--log-every", "50", "--corpus-chars", "500000"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoOptions(StageOptions):
    """What ``scalpel demo`` runs, validated on construction (a :class:`UsageError` names the bad value)."""

    out: Path
    """The demo folder: ``<out>/<stage>/`` per stage, ``<out>/report.html``, ``<out>/examples/``."""
    stages: tuple[str, ...] = STAGES
    steps: int = 12
    """Measured steps of the profile stage."""
    tune_budget_s: float = 120.0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.stages) - set(STAGES))
        if unknown:
            raise UsageError(f"Unknown demo stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}.")
        if not self.stages:
            raise UsageError(f"--stages names no stage; choose from {', '.join(STAGES)}.")
        if not 1 <= self.steps <= 10_000:
            raise UsageError(
                f"--steps {self.steps} must be between 1 and 10000 (measured steps of the profile stage)."
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> DemoOptions:
        """What ``scalpel demo``'s parsed flags ask for; without ``--out``, ``<runs>/<time>-demo/``."""
        from torchscalpel.fileio import default_run_dir

        stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
        out = args.out or default_run_dir("demo", getattr(args, "out_root", None))
        return cls(**{"out": out, **fields}, stages=stages, steps=args.steps, tune_budget_s=args.tune_budget)


@dataclass(slots=True)
class StageResult:
    """What one stage did: ok or not, how long, where its outputs are, one line of summary."""

    name: str
    ok: bool
    seconds: float
    output: str
    summary: str


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoResult:
    """Every stage's result, in order, and the combined report."""

    stages: list[StageResult]
    report: Path

    @property
    def exit_code(self) -> int:
        """0 when every stage succeeded, 1 otherwise."""
        return 0 if all(r.ok for r in self.stages) else 1


def run(options: DemoOptions, *, progress: Callable[[Any], None] | None = None) -> DemoResult:
    """Run the chosen stages in order (a stage's exception is its failed result, the others still run);
    returns every stage's result and the combined report's path. Each stage draws its own progress
    (``progress`` is not called: the demo's stages are several runs)."""
    from rich.markup import escape

    from torchscalpel.console import console, rule
    from torchscalpel.examples import copy_examples

    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    # The stages run copies in <out>/examples/: what ran stays next to its report, editable.
    target = Target(script=copy_examples(out / "examples") / "char_transformer.py", args=list(EXAMPLE_ARGS))
    c = console()
    results: list[StageResult] = []
    for i, name in enumerate(options.stages, start=1):
        rule(c, f"[bold]{i}/{len(options.stages)} {name}[/]")
        start = time.perf_counter()
        try:
            ok, output, summary = _STAGE_FUNCS[name](target, out / name, options)
        except Exception as exc:  # one broken stage must not cost the user the others
            ok, output, summary = False, str(out / name), f"{type(exc).__name__}: {exc}"
        results.append(StageResult(name, ok, time.perf_counter() - start, output, summary))
        if not ok:
            c.print(f"[red]stage {name} failed:[/] {escape(summary)}")
    return DemoResult(stages=results, report=_write_combined_report(out, results))


def _env(target: Target, out: Path, options: DemoOptions) -> tuple[bool, str, str]:
    from torchscalpel.console import make_console
    from torchscalpel.envcheck.report import build_report, write_json
    from torchscalpel.report.env_terminal import render

    report = build_report(probes=[])  # what 'scalpel env --no-probe' shows
    render(report, make_console())
    write_json(report, out / "env.json")
    return bool(report["complete"]), str(out / "env.json"), "environment facts and compatibility checks"


def _profile(target: Target, out: Path, options: DemoOptions) -> tuple[bool, str, str]:
    import sys

    import torchscalpel.report.profile_terminal as profile_terminal
    from torchscalpel.console import StepProgress
    from torchscalpel.runtime.profile_options import ProfileOptions
    from torchscalpel.stages import profile as stage

    profile = ProfileOptions(
        warmup=2,
        steps=options.steps,
        profile_steps=3,
        module_times=True,
        op_lines=False,
        target=target,
        out_dir=out,
        name="demo",
        command=("scalpel", *sys.argv[1:]),
    )
    with StepProgress(profile.warmup + options.steps, f"profiling {target.name}") as bar:
        record = stage.run(profile, progress=bar.update).record
    profile_terminal.render(record, out)
    s = record.summary_view()
    median = s.median_step_ms if s.median_step_ms is not None else float("nan")
    summary = f"median step {median:.1f} ms, breakdown sums within {100 * (s.breakdown_max_error or 0):.2f}%"
    return record.exit_code in (0, None), str(out), summary


def _doctor(target: Target, out: Path, options: DemoOptions) -> tuple[bool, str, str]:
    from rich.markup import escape

    import torchscalpel.report.doctor_terminal as doctor_terminal
    from torchscalpel.console import make_console
    from torchscalpel.doctor.options import DoctorOptions
    from torchscalpel.runtime.run_notes import how_it_stopped
    from torchscalpel.stages import doctor as stage

    doctor = DoctorOptions(steps=20, warmup=2, out_dir=out, target=target, command=("scalpel", "demo"))
    result = stage.run(doctor)  # run.json and report.html, as the stage's own command writes them
    assert result.record is not None
    doctor_terminal.render(
        result.findings,
        make_console(),
        header=f"[dim]{escape(how_it_stopped(result.record))}[/dim]\n",
    )
    return result.record.exit_code in (0, None), str(out), f"{len(result.findings)} finding(s)"


def _analyze(target: Target, out: Path, options: DemoOptions) -> tuple[bool, str, str]:
    trace = out.parent / "profile" / "trace.json.gz"
    if not trace.exists():
        return False, str(out), "needs the profile stage's trace"
    import json

    from torchscalpel.console import Phase
    from torchscalpel.report.html import write_analysis_html
    from torchscalpel.trace import analyze_traces
    from torchscalpel.units import fmt_bytes

    out.mkdir(parents=True, exist_ok=True)
    # the stage printed nothing while it read the trace: a line as it starts and as it ends
    size = fmt_bytes(trace.stat().st_size)
    with Phase("analyze", f"reading the profile's trace {trace.name} ({size}, gzip)") as phase:
        result = analyze_traces([trace])
        phase.outcome = "read" if not result.errors else f"{len(result.errors)} error(s)"
    data = result.to_dict()
    with Phase("analyze", "writing analysis.json and report.html"):
        (out / "analysis.json").write_text(json.dumps(data, indent=1, default=float), encoding="utf-8")
        write_analysis_html(data, out / "report.html")
    return not result.errors, str(out), f"analysed {trace.name}"


def tune_options(target: Target, out: Path, *, budget_s: float = 120.0) -> TuneOptions:
    """The demo's short tune: cheap knobs only (no cold compile), one confirmation pair, results in ``out``
    and nowhere else (no ``--config`` file)."""
    from torchscalpel.tune.options import TuneOptions

    return TuneOptions(
        target=target,
        out_dir=out,
        budget_s=budget_s,
        steps=6,
        warmup=2,
        knobs=("amp", "threads", "dataloader"),
        confirm_pairs=1,
        command=("scalpel", "demo"),
    )


def _tune(target: Target, out: Path, options: DemoOptions) -> tuple[bool, str, str]:
    import torchscalpel.report.tune_terminal as tune_terminal
    from torchscalpel.record import load_record
    from torchscalpel.report.tune_terminal import RichProgress
    from torchscalpel.sections import TuneSection
    from torchscalpel.stages import tune as stage

    tune_target = Target(
        script=target.script, args=["--steps", "60", "--log-every", "1000", "--corpus-chars", "500000"]
    )
    done = stage.run(tune_options(tune_target, out, budget_s=options.tune_budget_s), progress=RichProgress())
    result = done.search
    assert result is not None  # the demo never asks for --fit
    saved = load_record(out)  # drawn from what was saved, as report.html is
    tune_terminal.render(
        saved.section(TuneSection) or TuneSection(),
        out_dir=out,
        config_path=out / "scalpel.toml" if result.winner is not None else None,
        environment=saved.environment,
        target_text=" ".join(str(a) for a in tune_target.argv()),
    )
    # The tune table's own verdict line: "no candidate was measured: ..." when the budget ran out first.
    return True, str(out), result.headline() + (", numerics checked" if result.winner is not None else "")


def _plan(target: Target, out: Path, options: DemoOptions) -> tuple[bool, str, str]:
    # What 'scalpel plan --device A100-80GB --world-size 2 --strategy all --no-max-batch -- SCRIPT' does,
    # through the same stage
    import torchscalpel.report.plan_terminal as plan_terminal
    from torchscalpel.plan.options import PlanOptions
    from torchscalpel.stages import plan as plan_stage

    plan_options = PlanOptions(
        target=target,
        optimizer=None,
        precision="fp32",
        grad_accum=1,
        world_size=2,
        nodes=1,
        checkpointing="none",
        device="A100-80GB",
        search_max_batch=False,
        out_dir=out,
    )
    print(plan_terminal.render(plan_stage.run(plan_options)))
    return True, str(out), "per-rank memory for every strategy on 2 x A100-80GB"


SHIP_MODULES = {
    "sklearn": "scikit-learn",
    "onnx": "onnx",
    "onnxscript": "onnxscript",
    "onnxruntime": "onnxruntime",
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
}
"""What the ship stage imports beyond the core dependencies (module: distribution), all in torchscalpel[all]."""


def _ship(target: Target, out: Path, options: DemoOptions) -> tuple[bool, str, str]:
    from torchscalpel.stages.export_demo import run_ship_demo

    missing = [dist for mod, dist in SHIP_MODULES.items() if importlib.util.find_spec(mod) is None]
    if missing:
        return True, str(out), f'skipped: needs {", ".join(missing)} (pip install "torchscalpel[all]")'
    script = cast(Path, target.script)  # the demo's target is always the copied example script
    result = run_ship_demo(out, script=script.with_name("digits_cnn.py"))
    check = result["serve_check"]
    same = bool(result["parity_passed"] and check["same_argmax"])
    return (
        same,
        str(out),
        (
            f"exported and served on 127.0.0.1: {check['requests']} requests, "
            + ("same predictions as eager" if same else "predictions DIFFER from eager")
        ),
    )


_STAGE_FUNCS: dict[str, Callable[[Target, Path, DemoOptions], tuple[bool, str, str]]] = {
    "env": _env,
    "profile": _profile,
    "doctor": _doctor,
    "analyze": _analyze,
    "tune": _tune,
    "plan": _plan,
    "ship": _ship,
}


RECORD_STAGES = ("profile", "doctor", "tune", "plan")
"""Stages that leave a Run record in their folder; the combined report has a group for each one that ran."""


def _write_combined_report(out: Path, results: list[StageResult]) -> Path:
    """One report, as 'scalpel report' renders several records: a table of what every stage did, then
    the sections of each stage's record (profile, doctor, tune, plan)."""
    from torchscalpel.record import load_record, now_timestamp
    from torchscalpel.report.html import RecordGroup, render_records
    from torchscalpel.report.page import Section, link, table

    groups: list[RecordGroup] = []
    for r in results:
        if r.name not in RECORD_STAGES or not r.ok:
            continue
        try:
            record = load_record(out / r.name)
        except Exception:  # the stage's own failure is already in the table
            continue
        groups.append(
            RecordGroup(record=record, title=f"{r.name} · {record.name}", source=_rel(str(out / r.name), out))
        )
    stages = Section(
        id="demo-stages",
        title="Demo stages",
        body=table(
            ["stage", "result", "seconds", "summary", "outputs"],
            [
                (
                    r.name,
                    result_word(r),
                    f"{r.seconds:.1f}",
                    r.summary,
                    link(_rel(r.output, out)) if r.output else "-",
                )
                for r in results
            ],
            [False, False, True, False, False],
        )
        + '<p class="muted">Each stage also wrote its own files (run.json, report.html, trace, bundle) in its folder.</p>',
    )
    created = groups[0].record.created if groups else now_timestamp()
    html = render_records(
        groups, title="torchscalpel demo", subtitle=f"examples/char_transformer.py · {created}", lead=[stages]
    )
    return atomic_write_text(out / "report.html", html)


def _rel(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path

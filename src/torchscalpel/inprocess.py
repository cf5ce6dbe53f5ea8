"""The in-process API: measure a block of the user's own code, as ``scalpel profile`` measures a script.

For notebooks and for training loops that are a function inside a larger program::

    import torchscalpel

    model, opt = build()                      # built before the block: that is fine
    with torchscalpel.profile(steps=20, out="runs/x") as run:
        train(model, opt)                     # stopped after warmup + steps optimizer steps
    run.record                                # the RunRecord; run.out_dir holds run.json, report.html

    @torchscalpel.profile(steps=10)           # or as a decorator: each call is one run
    def train(): ...

``torchscalpel.lr``, ``batch``, ``tune`` and ``fix`` run a script (or ``module=``) in this process as the
``scalpel`` verbs do, through the same stage functions (``torchscalpel.stages.<verb>.run``), and return
their typed results; ``analyze`` reads traces and returns :class:`~torchscalpel.trace.TraceAnalysis`.

``torchscalpel.doctor(...)`` works the same way and runs every runtime rule over the block, plus
the static rules over the caller's file and the model sources the block used; ``run.findings``
holds the ranked findings. (The CLI's re-runs, the NaN origin search and ``--sanity``, need a
script to run again, so the in-process doctor leaves them out.)

The block runs under the same hooks and produces the same Run record and files as the CLI.
When enough steps ran, the runtime ends the block at a step boundary (the rest of the block
is skipped, as the CLI stops a script) and execution continues after the ``with``. An error
raised in the block still writes the record and then propagates.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from torchscalpel.doctor.window import DOCTOR_WINDOW, TIME_CAP_S
from torchscalpel.fileio import default_run_dir
from torchscalpel.lrfind.options import DEFAULT_MAX_LR, DEFAULT_MIN_LR
from torchscalpel.lrfind.options import DEFAULT_STEPS as DEFAULT_LR_STEPS
from torchscalpel.record import RunRecord, RunStatus
from torchscalpel.runtime.window import MEMORY_WINDOW, PROFILE_WINDOW
from torchscalpel.tune.window import BATCH_STEPS, BATCH_WARMUP, CONFIRM_PAIRS, TUNE_BUDGET_S, TUNE_WARMUP

# The runtime imports torch; this module is imported by ``import torchscalpel`` (and so by
# ``scalpel --help``), so it names the runtime's types for the checker only and imports the
# runtime when a block is built.
if TYPE_CHECKING:
    import os

    import torch

    from torchscalpel.compare.core import Comparison
    from torchscalpel.findings import Finding
    from torchscalpel.fix.stage import FixResult
    from torchscalpel.plan.result import PlanResult
    from torchscalpel.runtime.observer import Observer
    from torchscalpel.runtime.session import Attachment, RuntimeOptions, SetupHook
    from torchscalpel.runtime.target import Target
    from torchscalpel.stages.batch import BatchResult
    from torchscalpel.stages.lr import LrResult
    from torchscalpel.stages.tune import TuneRunResult
    from torchscalpel.trace.analyze import TraceAnalysis

_active: list[Attachment] = []
"""The attachment in force: hooks are global, so one block at a time."""


class InProcessRun(contextlib.ContextDecorator):
    """One measured block (or one call of a decorated function); ``record`` is set when it ends."""

    def __init__(
        self,
        *,
        options: RuntimeOptions,
        out: Path | None,
        report: bool,
        quiet: bool,
        observers: Sequence[Observer] = (),
        setup_hooks: Sequence[SetupHook] = (),
        finish: Callable[[InProcessRun], None] | None = None,
    ) -> None:
        self.options = options
        self._out = out
        self.report = report
        self.quiet = quiet
        self.observers = list(observers)
        self.setup_hooks = list(setup_hooks)
        self._finish = finish
        self.record: RunRecord | None = None
        """The Run record of the last block that ended (None while it runs)."""
        self.findings: list[Finding] = []
        """Doctor blocks: the ranked findings (``Finding`` objects) of the last block."""
        self.caller: str = "?"
        """``file:line`` of the code that opened the block."""
        self.out_dir: Path | None = None
        """Where the last block's run.json, report.html and trace went."""
        self._attachment: Attachment | None = None
        self._seed_before: dict[str, Any] = {}

    @property
    def where(self) -> str:
        """The block's place, readable: ``train.py:12``, or ``Cell In[3], line 4`` in a notebook."""
        from torchscalpel.findings import location_text

        path, _, line = self.caller.rpartition(":")
        return location_text(path, int(line)) if path and line.isdigit() else self.caller

    def __repr__(self) -> str:
        return f"<torchscalpel block at {self.where}: {self.record!r}>"

    def __enter__(self) -> InProcessRun:
        from torchscalpel.runtime.provenance import torch_seed_state
        from torchscalpel.runtime.session import Attachment

        if _active:
            raise RuntimeError("torchscalpel is already measuring a block in this process; nest no runs")
        self.out_dir = self._out or default_run_dir(self.options.name)
        self.options.out_dir = self.out_dir
        self.record = None
        self.caller = _caller()
        # the seed state before the block counts: a notebook seeds in an earlier cell (no wrapped call sees it)
        self._seed_before = torch_seed_state()
        attachment = Attachment(
            self.options,
            self.observers,
            self.setup_hooks,
            command=["torchscalpel.inprocess"],
            target={"inprocess": self.caller},
        )
        _active.append(attachment)
        try:
            attachment.attach()
        except BaseException:
            _active.clear()
            attachment.detach("failed", 1, "could not attach")
            raise
        self._attachment = attachment
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        from torchscalpel.runtime.memory_limit import MemoryLimitExceeded
        from torchscalpel.runtime.script import one_line_error
        from torchscalpel.runtime.session import StopScript

        attachment, self._attachment = self._attachment, None
        _active.clear()
        if attachment is None:
            return False
        status: RunStatus = "complete"
        code, error = 0, None
        if isinstance(exc, StopScript | MemoryLimitExceeded):
            status = "stopped" if isinstance(exc, StopScript) else "failed"
            code, error = (0, None) if isinstance(exc, StopScript) else (1, str(exc))
        elif isinstance(exc, KeyboardInterrupt):
            status, code, error = "interrupted", 130, "interrupted (Ctrl-C)"
        elif exc is not None:
            status, code, error = "failed", 1, one_line_error(exc)
        self.record = attachment.detach(status, code, error)
        self.record.provenance.setdefault("seeds", {})["before_block"] = self._seed_before
        if self._finish is not None:
            self._finish(self)
        # The runtime's own stop, and --memory-limit's, end the block quietly (the record says why).
        return isinstance(exc, StopScript | MemoryLimitExceeded)


def profile(
    *,
    steps: int | None = PROFILE_WINDOW.steps,
    warmup: int = PROFILE_WINDOW.warmup,
    out: str | Path | None = None,
    profile_steps: int = PROFILE_WINDOW.profile_steps,
    module_times: bool = False,
    op_lines: bool = True,
    step_kind: str = "auto",
    name: str = "inprocess",
    report: bool = True,
    quiet: bool = True,
) -> InProcessRun:
    """Profile the block (or each call of the decorated function) like ``scalpel profile``.

    ``steps=None`` lets the block finish; ``out`` defaults to ``scalpel-runs/<time>-<name>/``;
    ``quiet=False`` also prints the terminal summary. Bad values raise ``ValueError``. The defaults and the
    passes are ``scalpel profile``'s (:class:`~torchscalpel.runtime.profile_options.ProfileOptions`: the
    op-line pass runs after the profiler window unless ``op_lines=False``, as ``--no-op-lines``).
    """
    from torchscalpel.runtime.profile_options import ProfileOptions

    options = ProfileOptions(
        warmup=warmup,
        steps=steps,
        profile_steps=profile_steps,
        module_times=module_times,
        op_lines=op_lines,
        step_kind=step_kind,
    ).runtime(out_dir=None, name=name)

    def finish(run: InProcessRun) -> None:
        from torchscalpel.stages.profile import finish_profile

        assert run.record is not None and run.out_dir is not None
        finish_profile(run.record, run.out_dir, write_report=run.report, quiet=run.quiet)

    return InProcessRun(
        options=options, out=Path(out) if out is not None else None, report=report, quiet=quiet, finish=finish
    )


def doctor(
    *,
    steps: int | Literal["all", "auto"] | None = DOCTOR_WINDOW.steps,
    warmup: int = DOCTOR_WINDOW.warmup,
    out: str | Path | None = None,
    static: bool = True,
    time_cap_s: float | None = TIME_CAP_S,
    step_kind: str = "auto",
    name: str = "doctor-inprocess",
    report: bool = True,
    quiet: bool = True,
) -> InProcessRun:
    """Diagnose the block (or each call of the decorated function) like ``scalpel doctor``.

    ``run.findings`` are the ranked findings and ``run.record.findings`` their JSON form;
    ``quiet=False`` prints them. ``static=False`` skips the static rules. The window is
    ``scalpel doctor``'s (:data:`~torchscalpel.doctor.window.DOCTOR_WINDOW`: 300 steps, ended early by
    ``time_cap_s``, None or 0 for no cap); ``steps`` takes what
    :class:`~torchscalpel.doctor.options.DoctorOptions` takes, with the same meaning (``"auto"``: 300;
    ``"all"`` or None: until the block ends). ``run.record.sections["doctor"]["window"]`` says what ran.
    """
    from torchscalpel.doctor.api import TimeCap, assemble_findings, runtime_rules_for_block, window_facts
    from torchscalpel.doctor.options import DoctorOptions
    from torchscalpel.doctor.runtime_rules import DoctorObserver

    # the CLI's options, validation and sentences (a nan time cap, a bad step kind), before the block runs
    doctor_options = DoctorOptions(
        steps=steps, warmup=warmup, static=static, time_cap_s=time_cap_s, step_kind=step_kind
    )
    rules, sources = runtime_rules_for_block()
    cap = TimeCap(doctor_options.cap_s)  # as in ``scalpel doctor``: the step window, bounded for a slow loop
    rules.append(cap)
    observer = DoctorObserver(rules)
    planned = doctor_options.planned_steps
    options = doctor_options.runtime(steps=planned, out_dir=None, name=name)  # no profiler window, no scalars

    def finish(run: InProcessRun) -> None:
        from torchscalpel.stages.profile import finish_profile

        assert run.record is not None and run.out_dir is not None
        caller_file = Path(run.caller.rsplit(":", 1)[0])
        files = [caller_file.resolve()] if caller_file.is_file() else []  # a notebook cell has no file
        run.findings = assemble_findings(
            run.record, observer, observer.findings(run.record), rules, sources, files if static else None
        )
        run.record.sections["doctor"]["window"] = window_facts(planned, warmup, cap)
        finish_profile(run.record, run.out_dir, write_report=run.report, quiet=True)
        if not run.quiet:
            from rich.console import Console

            import torchscalpel.report.doctor_terminal as doctor_terminal

            doctor_terminal.render(run.findings, Console())

    return InProcessRun(
        options=options,
        out=Path(out) if out is not None else None,
        report=report,
        quiet=quiet,
        observers=[observer],
        setup_hooks=[observer.setup_hook],
        finish=finish,
    )


def memory(
    *,
    steps: int | Literal["default"] | None = "default",
    warmup: int = MEMORY_WINDOW.warmup,
    out: str | Path | None = None,
    memory_limit: str | int | None = None,
    step_kind: str = "auto",
    name: str = "memory-inprocess",
    report: bool = True,
    quiet: bool = True,
) -> InProcessRun:
    """Account the block's memory like ``scalpel memory``: ``run.record.sections["memory"]`` holds the
    breakdown, growth and (past ``memory_limit``, a size such as ``"2GiB"`` or bytes) the post-mortem.
    A block that crosses the limit ends there, like a step stop; the record says why.

    ``steps``: how many to account (None: all); by default ``scalpel memory``'s
    (:data:`~torchscalpel.runtime.window.MEMORY_WINDOW`: 20), or all under ``memory_limit`` as in
    ``scalpel memory``, so growth that crosses the limit late still gets its post-mortem."""
    from torchscalpel.memory.options import MemoryOptions
    from torchscalpel.stages.memory import make_observer, observer_setup
    from torchscalpel.units import parse_size

    limit = parse_size(memory_limit, flag="memory_limit") if isinstance(memory_limit, str) else memory_limit
    memory_options = MemoryOptions(steps=steps, warmup=warmup, memory_limit=limit, step_kind=step_kind)
    observer = make_observer(memory_options)
    options = memory_options.runtime(out_dir=None, name=name)

    def finish(run: InProcessRun) -> None:
        from torchscalpel.stages.memory import finish as finish_memory

        assert run.record is not None and run.out_dir is not None
        finish_memory(run.record, run.out_dir, json_path=None, write_report=run.report)
        if not run.quiet:
            import torchscalpel.report.memory_terminal as memory_terminal
            from torchscalpel.sections import MemorySection

            print("\n".join(memory_terminal.render(run.record.section(MemorySection) or MemorySection())))

    return InProcessRun(
        options=options,
        out=Path(out) if out is not None else None,
        report=report,
        quiet=quiet,
        observers=[observer],
        setup_hooks=[observer_setup(observer)],
        finish=finish,
    )


def plan(
    model: Callable[[], torch.nn.Module],
    batch: str,
    *,
    device: str | None = None,
    device_memory: str | None = None,
    world_size: int = 1,
    nodes: int = 1,
    strategy: str = "all",
    optimizer: str = "adamw",
    precision: str = "fp32",
    grad_accum: int = 1,
    checkpointing: str = "none",
    max_batch: bool = True,
    loss: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
    out: str | os.PathLike[str] | None = None,
) -> PlanResult:
    """Plan memory per rank for ``model()`` (a factory: it is built on fake tensors, nothing is
    allocated) on ``batch`` (``scalpel plan --batch`` grammar, e.g. ``"x=float32[8,3,32,32],y=int64[8]:10"``),
    as ``scalpel plan --model`` does with the same defaults: every strategy that makes sense for
    ``world_size`` on ``device`` (a name from ``scalpel plan --list-devices``; ``device_memory`` such as
    ``"24GiB"``; neither: this machine). With ``out``, run.json and report.html are written there as
    ``scalpel plan --out`` writes them. Returns the plan (``.rows``, ``.to_dict()``); print it with
    ``torchscalpel.report.plan_terminal.render``. A bad argument raises ``ValueError`` naming it."""
    from torchscalpel.plan.options import PlanOptions
    from torchscalpel.stages import plan as stage

    options = PlanOptions(
        model=model,
        batch=batch,
        loss=loss,
        optimizer=optimizer,
        precision=precision,
        strategy=strategy,
        world_size=world_size,
        nodes=nodes,
        grad_accum=grad_accum,
        checkpointing=checkpointing,
        device=device,
        device_memory=device_memory,
        search_max_batch=max_batch,
        out_dir=Path(out) if out is not None else None,
    )
    return stage.run(options)


def compare(*runs: str | os.PathLike[str] | RunRecord) -> Comparison:
    """What differs between runs (run folders, ``run.json`` files or records in memory), as
    ``scalpel compare`` computes it: phases with their noise, losses, environment, config and code, and
    a one-line verdict (``.verdict``). Print it with
    ``torchscalpel.report.compare_terminal.render``."""
    from torchscalpel.compare.core import compare_records, compare_runs
    from torchscalpel.errors import UsageError

    if len(runs) < 2:
        raise UsageError(f"compare needs two runs or more, got {len(runs)}.")
    if all(isinstance(r, RunRecord) for r in runs):
        return compare_records([r for r in runs if isinstance(r, RunRecord)])
    if any(isinstance(r, RunRecord) for r in runs):
        raise UsageError("compare takes either records or paths, not a mix (save the records first).")
    return compare_runs([r for r in runs if not isinstance(r, RunRecord)])


def lr(
    script: str | os.PathLike[str] | None = None,
    *args: str,
    module: str | None = None,
    min_lr: float = DEFAULT_MIN_LR,
    max_lr: float = DEFAULT_MAX_LR,
    steps: int = DEFAULT_LR_STEPS,
    step_kind: str = "auto",
    out: str | Path | None = None,
    report: bool = True,
) -> LrResult:
    """The learning-rate range test of ``scalpel lr``, with its defaults: run ``script`` (its ``args`` after
    it), or ``module=``, in this process with every param group's lr swept exponentially from ``min_lr`` to
    ``max_lr`` over ``steps`` optimizer steps. Returns :class:`~torchscalpel.stages.lr.LrResult`
    (``.suggested_lr``, ``.section``, ``.record``); run.json and report.html go to ``out`` (default
    ``scalpel-runs/<time>-lr-<name>/``). Bad values raise ``ValueError`` naming the argument."""
    from torchscalpel.lrfind.options import LrOptions
    from torchscalpel.stages import lr as stage

    options = LrOptions(min_lr=min_lr, max_lr=max_lr, steps=steps, step_kind=step_kind, report=report)
    target = _target(script, args, module)
    return stage.run(
        options.replace(
            target=target,
            out_dir=Path(out) if out is not None else None,
            name=f"lr-{target.name}",
            command=("torchscalpel.lr", *target.argv()),
        )
    )


def batch(
    script: str | os.PathLike[str] | None = None,
    *args: str,
    sizes: Sequence[int],
    module: str | None = None,
    steps: int = BATCH_STEPS,
    warmup: int = BATCH_WARMUP,
    out: str | Path | None = None,
    report: bool = True,
) -> BatchResult:
    """Samples/s of ``script`` (its ``args`` after it), or ``module=``, at each of ``sizes``, as ``scalpel batch``
    measures it with its defaults: one run per size in this process, every DataLoader's batch size set to it.
    Returns :class:`~torchscalpel.stages.batch.BatchResult` (``.best``, ``.section``: every size's row and
    the learning-rate advice). Bad values raise ``ValueError`` naming the argument."""
    from torchscalpel.stages import batch as stage
    from torchscalpel.tune.batch_finder import BatchOptions

    options = BatchOptions(sizes=tuple(sizes), steps=steps, warmup=warmup, report=report)
    target = _target(script, args, module)
    return stage.run(
        options.replace(
            target=target,
            out_dir=Path(out) if out is not None else None,
            command=("torchscalpel.batch", *target.argv()),
        )
    )


def tune(
    script: str | os.PathLike[str] | None = None,
    *args: str,
    module: str | None = None,
    budget_s: float = TUNE_BUDGET_S,
    steps: int | None = None,
    warmup: int = TUNE_WARMUP,
    knobs: Sequence[str] | None = None,
    seed: int = 0,
    confirm_pairs: int = CONFIRM_PAIRS,
    fit: str | None = None,
    config: str | Path | None = None,
    out: str | Path | None = None,
    quiet: bool = True,
) -> TuneRunResult:
    """Search for measured speedups of ``script`` (its ``args`` after it), or ``module=``, as ``scalpel tune``
    does with its defaults: each knob in a fresh process within ``budget_s`` seconds, the winners combined and
    confirmed against the baseline. ``steps=None`` is ``--steps auto`` (10 per trial, more when a step is short);
    ``fit="8GiB"`` searches the memory ladder instead. ``config``: also write the winner to this settings file
    (never over one scalpel tune did not write). Returns :class:`~torchscalpel.stages.tune.TuneRunResult`
    (``.search``: trials and winner; ``.paths``). ``quiet=False`` draws each trial."""
    from torchscalpel.stages import tune as stage
    from torchscalpel.tune.options import SilentProgress, TuneOptions
    from torchscalpel.tune.settings import KNOB_NAMES
    from torchscalpel.tune.window import MIN_MEASURE_S, TUNE_STEPS

    options = TuneOptions(
        budget_s=budget_s,
        steps=TUNE_STEPS if steps is None else steps,
        min_measure_s=MIN_MEASURE_S if steps is None else 0.0,
        warmup=warmup,
        knobs=tuple(knobs) if knobs is not None else KNOB_NAMES,
        seed=seed,
        confirm_pairs=confirm_pairs,
        fit=fit,
        config_path=Path(config) if config is not None else None,
        out_dir=Path(out) if out is not None else None,
    )
    target = _target(script, args, module)
    if quiet:
        progress: Any = SilentProgress()
    else:
        from torchscalpel.report.tune_terminal import RichProgress

        progress = RichProgress()
    return stage.run(
        options.replace(target=target, command=("torchscalpel.tune", *target.argv())), progress=progress
    )


def fix(
    *runs: str | os.PathLike[str],
    apply: bool = False,
    patch: str | Path | None = None,
    verify: bool = False,
    force: bool = False,
) -> FixResult:
    """The change tune, doctor and memory runs (their folders or run.json files) measured, as a patch of the
    user's own files, as ``scalpel fix`` computes it: ``.patch`` is the unified diff, ``.items`` what was and
    was not patched; ``apply=True`` writes the files (all or none), ``verify=True`` re-runs a patched copy.
    Needs ``torchscalpel[fix]``."""
    from torchscalpel.fix.options import FixOptions
    from torchscalpel.stages import fix as stage

    options = FixOptions(
        run_dirs=tuple(Path(r) for r in runs),
        apply=apply,
        patch=Path(patch) if patch is not None else None,
        verify=verify,
        force=force,
    )
    return stage.run(options)


def analyze(*traces: str | os.PathLike[str], top: int = 30) -> TraceAnalysis:
    """The streaming analysis ``scalpel analyze`` runs over torch.profiler traces (files, or folders of rank
    traces): per-step breakdown, top ops and kernels, overlap, stragglers and memory. A truncated trace is
    read up to its fault, which ``.errors`` names. Print it with
    ``torchscalpel.report.analyze_terminal.render(result.to_dict())``."""
    from torchscalpel.trace import analyze_traces

    if not traces:
        raise TypeError("analyze needs at least one trace file or folder")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a whole number of at least 1, got {top!r}")
    return analyze_traces([Path(t) for t in traces], top=top)


def _target(script: str | os.PathLike[str] | None, args: Sequence[str], module: str | None) -> Target:
    """The script (or module) an in-process verb runs, as ``scalpel VERB -- SCRIPT ARGS`` would name it."""
    from torchscalpel.runtime.target import Target

    if (script is None) == (module is None):
        raise TypeError("give the script to run, or module=, and not both")
    if module is not None:
        return Target(module=module, args=[str(a) for a in args])
    path = Path(script)  # type: ignore[arg-type]
    if not path.is_file():
        raise FileNotFoundError(f"script {path} does not exist (it is read relative to {Path.cwd()})")
    return Target(script=path, args=[str(a) for a in args])


def _caller() -> str:
    """``file:line`` of the user's code that opened the block (for the record's target)."""
    here = Path(__file__).resolve()
    for frame in inspect.stack()[1:]:
        path = Path(frame.filename)
        if path.resolve() != here and "contextlib" not in path.name:
            return f"{frame.filename}:{frame.lineno}"
    return "?"

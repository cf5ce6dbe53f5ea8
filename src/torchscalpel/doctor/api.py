"""The doctor's library entry points: :func:`diagnose` (run + static + re-runs) and :func:`check_static`.

``scalpel doctor`` and ``scalpel demo`` call these; nothing here prints.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import shlex
import sysconfig
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.doctor import catalogue
from torchscalpel.doctor.options import DoctorOptions
from torchscalpel.doctor.registry import rank_findings
from torchscalpel.doctor.rules.rt_run import needs_launcher
from torchscalpel.doctor.runtime_rules import DoctorObserver, RuntimeRule
from torchscalpel.doctor.static_scan import analyze_paths
from torchscalpel.doctor.window import RANK_STEPS
from torchscalpel.findings import Finding, counts
from torchscalpel.record import RunRecord
from torchscalpel.runtime.target import Target

if TYPE_CHECKING:
    from torchscalpel.doctor.rules.rt_numerics import NanLoss
    from torchscalpel.runtime.session import RuntimeOptions

_SKIP_DIRS = tuple(
    str(Path(p).resolve())
    for p in {
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
        os.path.dirname(torch.__file__),
        str(Path(__file__).resolve().parents[1]),
    }
)


class TimeCap(RuntimeRule):
    """Asks the runtime to stop once ``seconds`` have passed, and remembers after how many steps it did.

    The doctor window is a step count; this cap only bounds a very slow script. When it fires the
    evidence is shorter than planned, and :func:`diagnose` reports that in the record and the output
    (never a silent cut: findings that need later steps may be missing).
    """

    slugs = ()

    def __init__(self, seconds: float | None) -> None:
        super().__init__()
        self.seconds = seconds if seconds and seconds > 0 else None
        self.steps = 0
        self.capped_after: int | None = None
        self._start = time.monotonic()

    def on_start(self, session: Any) -> None:
        self._start = time.monotonic()

    def on_step_end(self, step: Any) -> None:
        self.steps += 1
        if (
            self.seconds is None
            or self.capped_after is not None
            or self.session is None
            or time.monotonic() - self._start < self.seconds
        ):
            return
        self.capped_after = self.steps
        self.session.request_stop(
            f"doctor time cap: {self.seconds:.0f} s reached", kind="time-cap", cap_s=self.seconds
        )

    def on_finish(self, record: Any) -> None:
        # Steps closed before the optimizer kind settled are merged later: count what the record kept.
        if self.capped_after is not None:
            self.capped_after = len(getattr(record, "steps", ()) or ())


class SourceFiles(RuntimeRule):
    """Collects the source files of the model classes the script uses (user code only), for static rules."""

    slugs = ()

    def __init__(self) -> None:
        super().__init__()
        self.files: set[str] = set()
        self._seen: set[int] = set()

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if not root or id(module) in self._seen:
            return
        self._seen.add(id(module))
        for m in module.modules():
            try:
                file = inspect.getsourcefile(type(m))
            except (TypeError, OSError):
                continue
            if file and os.path.exists(file) and not str(Path(file).resolve()).startswith(_SKIP_DIRS):
                self.files.add(str(Path(file).resolve()))


def check_static(paths: Iterable[Path], rules: Sequence[str] | None = None) -> list[Finding]:
    """Static rules over files and folders, ranked."""
    return rank_findings(analyze_paths(list(paths), rules=rules))


def _destroy_left_process_group() -> Callable[[], None]:
    """A setup hook: the script runs in this process, so a process group it leaves initialised would
    outlive it (and break the doctor's re-runs); destroy one created during the run. The script's own
    environment is never touched: it runs exactly as ``python SCRIPT`` would."""
    available = torch.distributed.is_available()
    before = available and torch.distributed.is_initialized()

    def undo() -> None:
        if available and not before and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    return undo


def launcher_hint(target: Target, record: RunRecord) -> str | None:
    """One sentence for a script that failed in torch.distributed's set-up (usually: no launcher set
    RANK/WORLD_SIZE/MASTER_ADDR), naming the doctor's multi-rank mode with the script's own arguments
    (shell-quoted); None otherwise. The ``script-failed`` finding carries the same commands as its fix."""
    if record.status != "failed" or not record.error:
        return None
    script = str(target.script) if target.script is not None else None
    if not needs_launcher(script, record.error):
        return None
    rest = shlex.join(target.argv() if target.script is not None else ["-m", *target.argv()])
    name = target.script.name if target.script is not None else "SCRIPT"
    return (
        f"The script failed while setting up torch.distributed, as it would under 'python {name}': "
        f"to diagnose it as a distributed run, give it a launcher with 'scalpel doctor --nproc N -- {rest}' "
        f"(or 'scalpel launch --nproc N --doctor -- {rest}')."
    )


def _restore_global_flags() -> Callable[[], None]:
    """A setup hook: the script runs in this process, so put back the torch flags it may flip
    (the doctor's re-runs and the tests run several scripts in one process)."""
    saved = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.is_grad_enabled(),
        torch.get_default_dtype(),
        torch.is_anomaly_enabled(),
        torch.are_deterministic_algorithms_enabled(),
    )

    def undo() -> None:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[0], saved[1]
        torch.set_grad_enabled(saved[2])
        torch.set_default_dtype(saved[3])
        torch.autograd.set_detect_anomaly(saved[4])
        torch.use_deterministic_algorithms(saved[5])

    return undo


def run_rules(
    target: Target,
    rules: list[RuntimeRule],
    options: RuntimeOptions,
    *,
    progress: Any = None,
    command: Sequence[str] = (),
) -> tuple[RunRecord, DoctorObserver]:
    """Run ``target`` in the window ``options`` gives (built by :meth:`DoctorOptions.runtime`) under
    ``rules``; the profiler's trace summary is added when the window profiled (CUDA only)."""
    from torchscalpel.runtime.session import run_target

    doctor = DoctorObserver(rules)
    record = run_target(
        target,
        options,
        observers=[doctor],
        setup_hooks=[_restore_global_flags, _destroy_left_process_group, doctor.setup_hook],
        progress=progress,
        command=command,
    )
    if options.profile_steps and options.out_dir is not None:
        try:
            from torchscalpel.runtime.trace_summary import add_trace_summary

            add_trace_summary(record, options.out_dir)
        except Exception as exc:  # the copy rule just stays silent without the trace summary
            record.notes.append(f"trace summary failed: {exc!r}")
    return record, doctor


def _quiet_window(steps: int, name: str) -> RuntimeOptions:
    """The window of a re-run (NaN origin, overfit one batch): no warm-up, no profiler, nothing written."""
    return DoctorOptions(steps=steps, warmup=0).runtime(steps=steps, out_dir=None, name=name)


def merge_findings(
    static: Sequence[Finding], runtime: Sequence[Finding], superseded: Collection[str] = frozenset()
) -> list[Finding]:
    """One list: a runtime finding of the same rule replaces the static one (taking its location if it
    has none); static findings of ``superseded`` slugs go; exact duplicates go; findings a more specific
    one explains go (each rule class's :meth:`~torchscalpel.doctor.rule.Rule.redundant`)."""
    out = list(runtime)
    by_rule: dict[str, list[Finding]] = {}
    for f in out:
        by_rule.setdefault(f.rule, []).append(f)
    for f in static:
        if f.rule in superseded:
            continue
        same = by_rule.get(f.rule, [])
        match = next(
            (
                r
                for r in same
                if r.location is None
                or f.location is None
                or (os.path.realpath(r.location.file) == os.path.realpath(f.location.file))
            ),
            None,
        )
        if match is not None:
            if match.location is None:
                match.location = f.location
            continue
        out.append(f)
    redundant = {id(r) for cls in catalogue.RULE_CLASSES for r in cls.redundant(out)}
    out = [f for f in out if id(f) not in redundant]
    seen: set[tuple[str, str]] = set()
    unique = []
    for f in out:
        key = (f.rule, f"{f.location}" if f.location else f.message)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return rank_findings(unique)


def diagnose(
    target: Target,
    options: DoctorOptions | None = None,
    *,
    progress: Any = None,
    command: Sequence[str] = (),
    **fields: Any,
) -> tuple[RunRecord, list[Finding]]:
    """Run ``target`` under every runtime rule in the window ``options`` asks (``fields``: the
    :class:`~torchscalpel.doctor.options.DoctorOptions` fields to set instead, for callers that name one
    or two), add static findings for the script and the model sources it uses, re-run to locate a NaN
    when one appeared, and (``sanity``) try to overfit one batch. When the time cap ended the window
    early, ``record.sections["doctor"]["window"]["capped"]`` says after how many steps. Returns the Run
    record (findings stored in ``record.findings``) and the ranked findings."""
    if options is None:
        options = DoctorOptions(**fields)
    elif fields:
        raise TypeError("give DoctorOptions or its fields as keywords, not both")
    steps, warmup, out_dir = options.steps, options.warmup, options.out_dir
    from torchscalpel.doctor.rules.rt_numerics import NanLoss

    sources = SourceFiles()
    rules: list[RuntimeRule] = [*catalogue.runtime_rules(), sources]
    run_steps: int | None
    cap = TimeCap(options.time_cap_s)
    tail_s = options.tail_s
    if _world_size() > 1:
        # Under a launcher every rank must stop at the same step: a rank stopped by its own clock
        # would leave the others blocked in their next collective until torch's timeout.
        tail_s = None
    if steps == "auto" and _world_size() > 1:
        run_steps = RANK_STEPS
        cap = TimeCap(None)
    else:
        run_steps = options.planned_steps
    rules.append(cap)
    # The profiler window only pays off on CUDA (host-device copies); on CPU it would just cost time.
    runtime = options.runtime(
        steps=run_steps, out_dir=out_dir, name=target.name, profile=torch.cuda.is_available(), tail_s=tail_s
    )
    record, doctor = run_rules(target, rules, runtime, progress=progress, command=command)
    notes: list[str] = []

    nan_rule = next(r for r in rules if isinstance(r, NanLoss))
    nan_steps = nan_rule.rerun_steps()
    if options.nan_rerun and nan_steps is not None and record.status != "interrupted":
        notes.append(_locate_nan(target, nan_rule, nan_steps))

    runtime_findings = doctor.findings(record)
    if options.sanity and not any(f.rule == "cannot-overfit-batch" for f in runtime_findings):
        runtime_findings += _sanity(target, notes)
    files: list[Path] = []
    if options.static and target.script is not None and target.script.is_file():
        files.append(target.script.resolve())
    findings = assemble_findings(
        record,
        doctor,
        runtime_findings,
        rules,
        sources,
        files if options.static else None,
        notes=notes,
        sanity=options.sanity,
    )
    record.sections["doctor"]["hint"] = launcher_hint(target, record)
    record.sections["doctor"]["window"] = window_facts(run_steps, warmup, cap, record=record)
    return record, findings


def window_facts(
    steps: int | None, warmup: int, cap: TimeCap, *, record: RunRecord | None = None
) -> dict[str, Any]:
    """The window the run was given and what cut it: ``capped`` is the sentence to show when the time
    cap ended the run before its planned steps (None otherwise); ``tail``: how the run went on past the
    window under the cheap checks (``cap_s``, ``ran_s``, ``end``: ``script`` or ``cap``), None when it did not."""
    capped = None
    if cap.capped_after is not None:
        planned = "the end of the script" if steps is None else f"{warmup}+{steps} planned steps"
        capped = (
            f"the {cap.seconds:.0f} s time cap ended the run after {cap.capped_after} step(s) of {planned}: "
            "findings that need later steps may be missing (pass --time-cap 0, or fewer --steps)"
        )
    return {
        "steps": steps,
        "warmup": warmup,
        "time_cap_s": cap.seconds,
        "steps_seen": cap.steps,
        "capped_after": cap.capped_after,
        "capped": capped,
        "tail": tail_facts(record) if record is not None else None,
    }


def tail_facts(record: RunRecord) -> dict[str, Any] | None:
    """How the run went on past its window (``RuntimeOptions.tail_s``), from ``config.stopped_by``; None
    when it stopped at the window or never reached it."""
    by = record.config.get("stopped_by") or {}
    if by.get("tail_end") not in ("script", "cap"):
        return None
    return {"cap_s": by.get("tail_s"), "ran_s": by.get("tail_ran_s"), "end": by.get("tail_end")}


def _world_size() -> int:
    """WORLD_SIZE as a launcher (torchrun, ``scalpel launch``) set it; 1 when absent or unreadable."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def runtime_rules_for_block() -> tuple[list[RuntimeRule], SourceFiles]:
    """The rules of an in-process doctor block (every runtime rule) and the model-source collector."""
    sources = SourceFiles()
    return [*catalogue.runtime_rules(), sources], sources


def assemble_findings(
    record: RunRecord,
    doctor: DoctorObserver,
    runtime_findings: list[Finding],
    rules: Sequence[RuntimeRule],
    sources: SourceFiles,
    static_files: list[Path] | None,
    *,
    notes: Sequence[str] = (),
    sanity: bool = False,
) -> list[Finding]:
    """Static findings over ``static_files`` plus the model sources the run used (None: no static
    rules), merged with the runtime and environment findings, ranked, stored in the record."""
    files = list(static_files or [])
    static_findings: list[Finding] = []
    if static_files is not None:
        files += [Path(f) for f in sorted(sources.files) if Path(f) not in files]
        static_findings = analyze_paths(files)
    findings = merge_findings(
        static_findings, runtime_findings + _env_findings(record), doctor.superseded_static()
    )
    record.findings = [f.to_dict() for f in findings]
    record.sections["doctor"] = {
        "rules_run": len([r for r in rules if r.slugs]),
        "static_files": [str(f) for f in files],
        "counts": counts(findings),
        "sanity": sanity,
        "notes": [n for n in notes if n],
        "hint": None,
    }
    return findings


def _env_findings(record: RunRecord) -> list[Finding]:
    """Environment checks (driver/CUDA/torch compatibility, ...) on the facts this run recorded."""
    try:
        from torchscalpel.envcheck.checks import run_checks
    except ImportError:  # an install without the env stage still gets every doctor rule
        return []
    try:
        # machine-busy is about when the run was measured, not about the script: the profile summary and
        # `scalpel env` say it; as a finding it would make a clean script's findings depend on the load
        found = [f for f in run_checks(record.environment) if f.rule != "machine-busy"]
    except Exception as exc:  # env checks must never cost the user the doctor's findings
        record.notes.append(f"environment checks failed: {exc!r}")
        return []
    for f in found:
        f.source = "env"
    return found


def _locate_nan(target: Target, nan_rule: NanLoss, steps: int) -> str:
    """Re-run ``steps`` steps (up to the first non-finite loss) with the dispatch-mode tracer and anomaly detection."""
    from torchscalpel.doctor.nan_trace import NanOpTracer

    tracer = NanOpTracer()
    sink = io.StringIO()
    try:
        # The script's prints and anomaly mode's tracebacks were already seen once: keep the re-run quiet.
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            run_rules(target, [tracer], _quiet_window(steps, f"{target.name}-nan"))
    except Exception as exc:  # the first run's findings stand without the re-run
        return f"NaN re-run failed: {exc!r}"
    if tracer.found:
        nan_rule.set_op_origin(tracer.found)
        return f"NaN re-run found {tracer.found['op']}"
    return "NaN re-run did not reproduce the non-finite value (unseeded randomness?)"


def _sanity(target: Target, notes: list[str]) -> list[Finding]:
    from torchscalpel.doctor.sanity import SANITY_STEPS, OverfitOneBatch

    rule = OverfitOneBatch()
    record, doctor = run_rules(target, [rule], _quiet_window(SANITY_STEPS, f"{target.name}-sanity"))
    notes.append(f"sanity run: {len(record.steps)} steps on a repeated batch, status {record.status}")
    return doctor.findings(record)

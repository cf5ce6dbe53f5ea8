"""Run one trial in a fresh subprocess, enforce its time limit, and read back what it measured."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchscalpel.childproc import child_env as base_child_env
from torchscalpel.childproc import kill_tree
from torchscalpel.errors import ScalpelError
from torchscalpel.record import RunRecord, load_record
from torchscalpel.runtime.target import Target
from torchscalpel.tune.settings import TuneSettings
from torchscalpel.tune.states import TrialStatus, Verdict


@dataclass(kw_only=True, slots=True)
class TrialResult:
    """One trial's outcome, as the search and the report use it."""

    label: str
    settings: dict[str, Any]
    family: str = "baseline"
    """Knob family (``amp``, ``compile``, ...), ``combined`` or ``baseline``."""
    status: TrialStatus = TrialStatus.OK
    """How the trial ended (:class:`~torchscalpel.tune.states.TrialStatus`)."""
    cause: str = ""
    """For failures: one line naming the cause."""
    median_ms: float | None = None
    step_ms: list[float] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    peak_bytes: int | None = None
    compile: dict[str, Any] = field(default_factory=dict)
    apply: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    out_dir: str = ""
    startup_ms: float | None = None
    """One-time cost of the run: its warm-up steps' time above as many steady steps (compile, the
    first call's allocations, DataLoader workers starting); :mod:`torchscalpel.tune.payback` sets a
    candidate's against the baseline's."""
    baseline_startup_ms: float | None = None
    """The baseline runs' one-time cost beside ``startup_ms`` (the confirmation baselines' median; for a
    screened candidate the search's reference baseline is used instead)."""
    payback: dict[str, Any] = field(default_factory=dict)
    """For a candidate with a start-up cost: :meth:`torchscalpel.tune.payback.Payback.to_dict` (one-time
    cost, per-step gain, steps to pay back, end to end over the run's length when known)."""
    steady_note: str = ""
    """When dynamo compiled during a measured step: which, why, and what the median was taken over."""
    # Filled by the search:
    speedup: float | None = None
    """The candidate's one speedup (:func:`torchscalpel.tune.speedup.speedup_of`): the confirmation's
    when it went through confirmation, else its screening ratio ``baseline_ms / median_ms``."""
    speedup_pair: list[float | None] | None = None
    """``[baseline ms, candidate ms]`` of the pair ``speedup`` is the ratio of."""
    speedup_spread: list[float] | None = None
    """Lowest and highest pair ratio (None with one pair: not measured)."""
    deviation: float | None = None
    tolerance: float | None = None
    baseline_ms: float | None = None
    """Median step time of the baseline run this trial was screened against (the most recent
    baseline re-measure before it); with ``median_ms``, the screening pair."""
    reason: str = ""
    """Why the search chose this candidate (the profile's evidence and what the knob addresses)."""
    reason_short: str = ""
    """The same in a few words (``compute-bound: bf16 matmuls``), for the terminal table."""
    confirm_ratios: list[float] = field(default_factory=list)
    """Baseline/candidate ratios of the interleaved confirmation pairs."""
    confirm_pairs: list[list[float]] = field(default_factory=list)
    """The confirmation pairs' medians, ``[baseline_ms, candidate_ms]`` each."""
    verdict: Verdict = Verdict.UNJUDGED
    """What the search concluded (:class:`~torchscalpel.tune.states.Verdict`)."""
    note: str = ""

    def __post_init__(self) -> None:
        self.status = TrialStatus.parse(self.status)
        self.verdict = Verdict.parse(self.verdict)

    @property
    def ok(self) -> bool:
        """The trial ran and produced step times."""
        return self.status == TrialStatus.OK and self.median_ms is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (for ``record.sections["tune"]``): the states as their plain string values."""
        data = asdict(self)
        data["status"], data["verdict"] = str(self.status), str(self.verdict)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        """Read back :meth:`to_dict` output (unknown keys ignored; older status spellings accepted)."""
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def child_env(settings: TuneSettings, cache_dir: Path | None) -> dict[str, str]:
    """Environment for a trial process: this torchscalpel on the path, a shared inductor cache."""
    env = base_child_env()
    if cache_dir is not None:
        # Shared across trials (and runs): a warm compile costs ~2 s instead of 15-25 s.
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))
    if settings.compile is not None and settings.dataloader.num_workers:
        # Inductor's compile pool deadlocks after a DataLoader worker fork on a cold cache.
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    return env


def profile_steps_for(steps: int) -> int:
    """Steps the baseline's facts run profiles: two when the window has room (one is cut short by
    the profiler's start on some builds), else one; the plain baseline run is never profiled."""
    return 2 if steps >= 4 else 1


def trial_command(
    target: Target,
    settings: TuneSettings,
    out_dir: Path,
    *,
    warmup: int,
    steps: int,
    seed: int,
    facts: bool = False,
    module_times: bool = False,
    step_kind: str = "auto",
    profile_steps: int = 0,
) -> list[str]:
    """The command line of one trial process."""
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel.tune.trial",
        "--settings",
        json.dumps(settings.to_dict()),
        "--out",
        str(out_dir),
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--seed",
        str(seed),
    ]
    if facts:
        cmd.append("--facts")
    if module_times:
        cmd.append("--module-times")
    if step_kind != "auto":
        cmd += ["--step-kind", step_kind]
    if profile_steps:
        cmd += ["--profile-steps", str(profile_steps)]
    if target.module:
        cmd += ["-m", target.module, "--", *target.args]
    else:
        cmd += ["--", str(target.script), *target.args]
    return cmd


def run_trial(
    target: Target,
    settings: TuneSettings,
    out_dir: Path,
    *,
    warmup: int,
    steps: int,
    seed: int,
    timeout_s: float,
    family: str = "baseline",
    facts: bool = False,
    module_times: bool = False,
    cache_dir: Path | None = None,
    step_kind: str = "auto",
    profile_steps: int = 0,
) -> TrialResult:
    """Run one trial process; never raises for the script's own failures (they become the result)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = trial_command(
        target,
        settings,
        out_dir,
        warmup=warmup,
        steps=steps,
        seed=seed,
        facts=facts,
        module_times=module_times,
        step_kind=step_kind,
        profile_steps=profile_steps,
    )
    result = TrialResult(
        label=settings.label(), settings=settings.to_dict(), family=family, out_dir=str(out_dir)
    )
    start = time.monotonic()
    with (out_dir / "stdout.txt").open("wb") as out, (out_dir / "stderr.txt").open("wb") as err:
        # A new session, so a timeout kills the script's DataLoader workers and compile pool too.
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=err, env=child_env(settings, cache_dir), start_new_session=True
        )
        try:
            code = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            result.status = TrialStatus.TIMEOUT
            result.cause = f"stopped after {timeout_s:.0f} s, its share of the budget"
            result.wall_s = time.monotonic() - start
            return result
        except BaseException:  # Ctrl-C in the parent: do not leave the trial running
            _kill_group(proc)
            raise
    result.wall_s = time.monotonic() - start
    record = _read_record(out_dir)
    stderr_tail = _tail(out_dir / "stderr.txt")
    if record is None:
        result.status = TrialStatus.FAILED
        result.cause = _signal_cause(code) or (
            f"the trial process exited with code {code} before writing a record: {stderr_tail or 'no output'}"
        )
        return result
    fill_from_record(result, record)
    if record.status in ("failed", "interrupted") or code != 0:
        result.status = TrialStatus.FAILED
        result.cause = classify_error(record.error or stderr_tail, code)
    elif result.median_ms is None and result.steady_note:
        result.status = TrialStatus.FAILED
        result.cause = result.steady_note
    elif result.median_ms is None:
        result.status = TrialStatus.FAILED
        result.cause = "no measured steps: the script ended before the warm-up was over; lower --warmup"
    elif settings.to_dict() and not result.apply.get("fired"):
        result.status = TrialStatus.NOT_APPLIED
        skipped = result.apply.get("skipped") or []
        result.cause = "; ".join(skipped) or "the knob found nothing to change in this script"
    return result


STEADY_MIN = 3
"""Measured steps a steady-state median needs after the last step that compiled."""


def steady_steps(steps: list[tuple[int, float]], compiled: list[dict[str, Any]]) -> tuple[list[float], str]:
    """The measured steps at steady state and, when dynamo compiled during timing, what happened.

    ``steps``: (index, ms) of the measured steps; ``compiled``: the trial's ``compiled_steps`` (index,
    warm-up, guard). A step that compiled, and every step before it, is not steady state: the median is
    taken over the steps after the last compile when at least :data:`STEADY_MIN` (and half the window)
    remain; otherwise no step is (empty list) and the text is the reason, never an average over a
    compile."""
    late = [c for c in compiled if not c.get("warmup")]
    if not late or not steps:
        return [ms for _, ms in steps], ""
    from torchscalpel.tune.triage import guard_advice

    last = max(int(c.get("index", -1)) for c in late)
    after = [ms for i, ms in steps if i > last]
    guards = [str(c.get("guard") or "") for c in late if c.get("guard")]
    what = (
        f"dynamo compiled during {len(late)} of {len(steps)} measured step(s) "
        f"({sum(float(c.get('compile_s') or 0.0) for c in late):.1f} s"
        + (f"; recompile guard: {guards[-1]}" if guards else "")
        + ")"
    )
    advice = guard_advice(guards[-1] if guards else "")
    if len(after) >= max(STEADY_MIN, len(steps) // 2):
        return after, f"{what}: timed the {len(after)} steps after it" + (f"; {advice}" if advice else "")
    return [], f"not measured: {what}, too few steady steps after it" + (f"; {advice}" if advice else "")


def fill_from_record(result: TrialResult, record: RunRecord) -> None:
    """Copy step times (steady state only, :func:`steady_steps`), losses, memory and the trial section
    into ``result``."""
    trial = record.sections.get("trial", {})
    result.apply = trial.get("apply", {})
    result.compile = trial.get("compile", {})
    timed = [(s.index, s.total_ms) for s in record.measured_steps if s.total_ms > 0]
    measured, result.steady_note = steady_steps(timed, list(result.compile.get("compiled_steps") or []))
    result.step_ms = measured
    result.median_ms = statistics.median(measured) if measured else None
    warm = [s.total_ms for s in record.steps if s.warmup and s.total_ms > 0]
    if warm and result.median_ms is not None:
        result.startup_ms = round(max(0.0, sum(warm) - len(warm) * result.median_ms), 1)
    result.losses = [s.loss for s in record.steps]
    result.facts = record.sections.get("tune_facts", {})
    cuda = [s.cuda_allocated_peak for s in record.steps if s.cuda_allocated_peak]
    result.peak_bytes = max(cuda) if cuda else trial.get("peak_rss_bytes")


def classify_error(error: str, code: int | None) -> str:
    """One line naming the cause of a failed trial: out of memory, compile error, or the exception."""
    text = (error or "").strip().splitlines()
    last = text[-1] if text else f"exit code {code}"
    lowered = (error or "").lower()
    if "out of memory" in lowered or "cannot allocate memory" in lowered:
        return f"out of memory: {last}"
    if any(
        k in (error or "")
        for k in (
            "BackendCompilerFailed",
            "torch._dynamo",
            "torch._inductor",
            "InductorError",
            "Unsupported",
            "TorchRuntimeError",
        )
    ):
        return f"compile error: {last}"
    return f"crashed: {last}"


def _signal_cause(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    sig = -code
    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
    if sig == signal.SIGKILL:
        return f"killed by {name} (most likely out of memory)"
    return f"killed by {name}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    kill_tree(proc)
    proc.wait()


def _read_record(out_dir: Path) -> RunRecord | None:
    if not (out_dir / "run.json").exists():
        return None
    try:
        return load_record(out_dir)
    except ScalpelError:
        return None


def _tail(path: Path, limit: int = 400) -> str:
    """The last non-empty line of a log (the exception line, for a traceback), shortened."""
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""

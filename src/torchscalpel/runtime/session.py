"""Run an unmodified script in-process, as ``python SCRIPT ARGS`` would, and record every step.

:func:`run_target` is the one entry point for every stage that needs a live run (profile,
doctor, plan, tune trials). It never changes what the script computes; set-up hooks (tuning
knobs) are the explicit exception, and each is undone afterwards.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchscalpel.options import PROFILE_EVENT_BUDGET, STEP_TIMEOUT_S
from torchscalpel.record import RunRecord, RunStatus, StepRecord
from torchscalpel.runtime.clock import clock_for
from torchscalpel.runtime.hooks import HookSet
from torchscalpel.runtime.memory import StepMemory
from torchscalpel.runtime.memory_limit import MemoryLimitExceeded
from torchscalpel.runtime.observer import Observer, listeners_by_event
from torchscalpel.runtime.run_notes import no_optimizer_note, no_step_note, seen_summary
from torchscalpel.runtime.script import ExecOptions, run_script
from torchscalpel.runtime.target import Target
from torchscalpel.runtime.timeline import Timeline
from torchscalpel.runtime.window import check_window

SetupHook = Callable[[], Callable[[], None] | None]

UNDECIDED_SLACK_STEPS = 256
"""Forward/backward-delimited steps to allow beyond the target before treating a script that
built an optimizer (but never stepped it) as inference and stopping it."""


DEFAULT_EVENT_BUDGET = PROFILE_EVENT_BUDGET
"""Trace events one profiler window may hold (:data:`torchscalpel.options.PROFILE_EVENT_BUDGET`)."""


class StopScript(BaseException):
    """Raised inside the script at a step boundary to end it after the requested steps.

    A ``BaseException`` so the script's own ``except Exception`` blocks do not swallow it.
    """


@dataclass(kw_only=True, slots=True)
class RuntimeOptions:
    """How to run and what to measure."""

    warmup: int = 2
    """Steps run before measuring (compilation, allocator warm-up, first-batch effects)."""
    steps: int | None = 20
    """Measured steps, after which the script is stopped; ``None`` lets it finish."""
    out_dir: Path | None = None
    """Where the profiler trace goes; nothing is written when None."""
    profile_steps: int = 3
    """Steps inside the torch.profiler window (0: no profiler, timeline only)."""
    profile_event_budget: int | None = DEFAULT_EVENT_BUDGET
    """Trace events the profiler window may hold (``--profile-budget``; None: no limit): beyond it the
    window covers fewer steps, drops shapes and memory, or cuts its step short."""
    op_line_steps: int = 0
    """Steps of the op-line pass after the profiler window (:mod:`~torchscalpel.runtime.op_lines`): each
    top op's user line and shapes, and the pattern findings; ``scalpel profile`` asks for 1 (``--no-op-lines``: 0).
    Off by default so doctor's and tune's runs keep their windows as they were."""
    with_stack: bool = False
    """Record torch's own Python stacks in the profiler window (``--with-stack``: the full trace, slower)."""
    record_shapes: bool = False
    """Keep input shapes in the profiler window even where the event budget would drop them (``--record-shapes``)."""
    module_times: bool = False
    """Also time the forward of each submodule (for tune's hottest-region search)."""
    device: str | None = None
    """Timing device; default: the device of the first root module's parameters."""
    name: str = "run"
    step_kind: str = "auto"
    """What delimits a step (:data:`~torchscalpel.runtime.window.STEP_KINDS`): ``auto`` picks the strongest boundary seen."""
    step_scalars: bool = True
    """Record each step's learning rate and the norm the script's ``clip_grad_norm_`` returned
    (``sections["steps_extra"]``, what ``--tensorboard`` / ``--mlflow`` export). Stages that never export
    (memory, plan) and doctor without tracking turn it off: then ``clip_grad_norm_`` is not wrapped."""
    step_timeout_s: float | None = STEP_TIMEOUT_S
    """Stop the script when no step of the kind the run expects has ended this long after the
    start (a loop the runtime cannot recognise must not run to its end); None waits forever."""
    tail_s: float | None = None
    """After the measured steps of a training run, let the script go on for up to this many seconds
    instead of stopping it: no step, span or observer event is recorded, only the set-up hooks' wrappers
    stay (the doctor's checks of saves, loads and exports at a script's end). None or 0: stop at once."""

    def __post_init__(self) -> None:
        if self.op_line_steps < 0:
            raise ValueError(f"the op-line pass needs 0 or more steps, got {self.op_line_steps}")
        if self.tail_s is not None and not (math.isfinite(self.tail_s) and self.tail_s >= 0):
            raise ValueError(f"the tail needs 0 or more seconds, got {self.tail_s}")
        check_window(
            warmup=self.warmup,
            steps=self.steps,
            profile_steps=self.profile_steps,
            step_kind=self.step_kind,
            step_timeout_s=self.step_timeout_s,
            profile_event_budget=self.profile_event_budget,
        )


@dataclass(slots=True)
class Session:
    """The live state of one run, shared by the hooks and handed to observers."""

    options: RuntimeOptions
    observers: list[Observer]
    timeline: Timeline = field(init=False)
    memory: StepMemory = field(init=False)
    root_modules: weakref.WeakSet[torch.nn.Module] = field(default_factory=weakref.WeakSet)
    optimizers: weakref.WeakSet[torch.optim.Optimizer] = field(default_factory=weakref.WeakSet)
    loaders: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    notes: list[str] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=lambda: {"models": 0, "optimizers": 0, "loaders": 0})
    """How many distinct models, optimizers and loaders the run saw (the weak sets above empty
    once the script's objects are freed; these counts stay for the record's notes)."""
    samples_unknown: dict[str, str] = field(default_factory=dict)
    """Why a training batch's size could not be read (``batch``: a DataLoader batch, ``forward``: a root
    model's inputs), the first reason of each: what the summary says when it has no samples/s."""
    scaled_losses: dict[int, torch.Tensor] = field(default_factory=dict)
    """GradScaler outputs by id, with the scale they were multiplied by (to report the true loss)."""
    stop_reason: str | None = None
    stop_facts: dict[str, Any] = field(default_factory=dict)
    """Why the runtime stopped the script, for ``record.config["stopped_by"]``: ``kind`` (steps, time-cap,
    divergence, memory-limit, no-step, asked) and its figures (``cap_s``); the words are ``stop_reason``."""
    device: torch.device | None = None
    window: Any = None
    hooks: Any = None
    """The installed :class:`~torchscalpel.runtime.hooks.HookSet` (None outside a run)."""
    grad_forward_seen: bool = False
    """A root forward returned a tensor that requires grad: training is likely, even before a backward."""
    eval_forwards: int = 0
    """Root forwards run without grad while training was expected (evaluation): never steps."""
    loop_started: float | None = None
    """When the first root forward or backward ran: the step timeout counts from there, so a long
    set-up (tokenising a corpus, downloading nothing, building a model) is never held against it."""
    tail_started: float | None = None
    """When the run went on past its window (``RuntimeOptions.tail_s``); None while in the window."""
    _disabled: set[int] = field(default_factory=set)
    _stopping: bool = False

    listeners: dict[str, list[Observer]] = field(init=False)
    """Per event, the observers that override it: events nobody listens to cost nothing."""

    def __post_init__(self) -> None:
        self.listeners = listeners_by_event(self.observers)
        self.device = torch.device(self.options.device) if self.options.device else None
        forced = None if self.options.step_kind == "auto" else self.options.step_kind
        self.timeline = Timeline(
            clock_for(self.device),
            on_close=self._step_closed,
            forced_kind=forced,
            on_kind_change=self._kind_changed,
        )
        self.memory = StepMemory(self.device)

    def add_observer(self, observer: Observer) -> None:
        """Add a runtime part that listens like an observer (the profiler window's cut points)."""
        self.observers.append(observer)
        self.listeners = listeners_by_event(self.observers)

    # ----- called by hooks ----------------------------------------------------------------
    def emit(self, event: str, *args: Any) -> None:
        """Call ``event`` on every observer; an observer that raises is disabled, never the run."""
        for obs in self.listeners[event]:
            if id(obs) in self._disabled:
                continue
            try:
                getattr(obs, event)(*args)
            except StopScript:
                raise
            except Exception as exc:
                self._disabled.add(id(obs))
                self.notes.append(f"observer {obs.name} failed in {event} and was disabled: {exc!r}")

    def note_root_module(self, module: torch.nn.Module) -> None:
        """Remember a root module; the first one fixes the timing device if none was given."""
        if module not in self.root_modules:
            self.root_modules.add(module)
            self.seen["models"] += 1
            if self.device is None:
                param = next(iter(module.parameters()), None)
                if param is not None and param.device.type == "cuda":
                    self.device = param.device
                    self.timeline.switch_clock(clock_for(param.device))
                    self.memory = StepMemory(param.device)

    def note_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if optimizer not in self.optimizers:
            self.optimizers.add(optimizer)
            self.seen["optimizers"] += 1

    def note_loader(self, loader: Any) -> None:
        if loader not in self.loaders:
            self.loaders.add(loader)
            self.seen["loaders"] += 1

    def loss_of(self, tensor: torch.Tensor) -> Any:
        """What the record keeps as the loss: detached, unscaled, read after the step's sync point."""
        factor = self.scaled_losses.pop(id(tensor), None)
        self.scaled_losses.clear()  # ids of tensors already freed must not match later ones
        if factor is not None:
            return tensor.detach() / factor
        return tensor.detach()

    def boundary(self, kind: str, optimizer_id: int | None = None) -> None:
        """A possible step end; closes the step and stops the script when enough steps ran."""
        if self._stopping or self.tail_started is not None:
            return
        primary = self.timeline.primary_optimizer
        if (
            kind == "optimizer"
            and optimizer_id is not None
            and primary not in (None, optimizer_id)
            and primary not in {id(o) for o in self.optimizers}
        ):
            # the optimizer that delimited steps was freed (k-fold: a new model and optimizer per fold)
            self.timeline.adopt_primary(optimizer_id)
        step = self.timeline.boundary(kind, optimizer_id)
        if step is None:
            return
        if self.stop_reason or self._enough_steps():
            if not self.stop_reason and self.options.tail_s and kind in ("optimizer", "backward"):
                self._begin_tail()
                return
            self._stopping = True
            if self.window is not None:
                self.window.close()
            if not self.stop_reason:
                self.stop_facts = {"kind": "steps"}
            self.stop_reason = self.stop_reason or f"stopped after {len(self.timeline.steps)} steps"
            raise StopScript(self.stop_reason)

    def _begin_tail(self) -> None:
        """The window's steps are done: go on without measuring (``RuntimeOptions.tail_s``). Only a training
        run's tail is ticked (its backward, optimizer, batches and root forwards bound it); an inference loop
        stops as before."""
        if self.window is not None:
            self.window.close()
        self.tail_started = time.monotonic()
        self.stop_facts = {"kind": "steps", "tail_s": self.options.tail_s}
        if self.hooks is not None:
            self.hooks.enter_tail()

    def tail_tick(self) -> None:
        """Called by the hooks after the window: end the script once the tail has run ``tail_s`` seconds."""
        cap = self.options.tail_s
        if self.tail_started is None or self._stopping or not cap:
            return
        ran = time.monotonic() - self.tail_started
        if ran < cap:
            return
        self._stopping = True
        self.stop_facts = {"kind": "steps", "tail_s": cap, "tail_ran_s": round(ran, 3), "tail_end": "cap"}
        self.stop_reason = f"the {cap:g} s tail cap ended the run {ran:.1f} s past its window"
        raise StopScript(self.stop_reason)

    def training_expected(self) -> bool:
        """True once something says the script trains: an optimizer exists, a forward produced
        gradients, a backward or optimizer step delimited steps, or the user fixed such a kind."""
        return bool(self.optimizers) or self.grad_forward_seen or self.timeline.kind != "forward"

    def settled(self) -> bool:
        """True when the steps closed so far are of the kind the run will keep.

        Forward- or backward-delimited steps while an optimizer exists are provisional: the first
        optimizer step merges them. Warm-up, the profiler window and root narrowing wait for this.
        """
        kind = self.timeline.kind
        return (
            self.timeline.forced
            or kind == "optimizer"
            or not (self.optimizers or (kind == "forward" and self.grad_forward_seen))
        )

    def check_progress(self) -> None:
        """Stop a run whose loop is not recognised: no settled step within ``step_timeout_s`` of the
        first root forward or backward (called from those hooks)."""
        limit = self.options.step_timeout_s
        if limit is None or self._stopping or self.options.steps is None or self.tail_started is not None:
            return
        now = time.monotonic()
        if self.loop_started is None:
            self.loop_started = now
        if (self.timeline.steps and self.settled()) or now - self.loop_started < limit:
            return
        self._stopping = True
        if self.window is not None:
            self.window.close()
        self.stop_facts = {"kind": "no-step"}
        self.stop_reason = (
            f"no step was recognised in {limit:.0f} s: {seen_summary(self)}; "
            "delimit steps with --step-kind (optimizer, backward or forward) or the in-process API"
        )
        raise StopScript(self.stop_reason)

    def _kind_changed(self, kind: str) -> None:
        """A stronger step kind appeared: earlier steps were merged, so a window opened on them restarts."""
        if self.window is not None:
            self.window.restart()

    def _enough_steps(self) -> bool:
        """True once warm-up plus measured steps are done, for the kind of step seen so far.

        Before any optimizer steps, forward- or backward-delimited steps may just be the start of
        a training loop (the first forward of step 0, micro-batches of gradient accumulation), so
        those kinds stop the script early only when nothing suggests an optimizer step is coming.
        """
        if self.options.steps is None:
            return False
        target = self.options.warmup + self.options.steps
        n = len(self.timeline.steps)
        if n < target:
            return False
        kind = self.timeline.kind
        if kind == "optimizer":
            return True
        expecting_optimizer = bool(self.optimizers) or (kind == "forward" and self.grad_forward_seen)
        return not expecting_optimizer or n >= target + UNDECIDED_SLACK_STEPS

    def request_stop(self, reason: str, *, kind: str = "asked", **facts: Any) -> None:
        """Ask the runtime to end the script at the next step boundary (observers use this). ``kind`` and
        ``facts`` (``cap_s`` of a time cap) say why, for the end-of-run wording
        (:func:`torchscalpel.runtime.run_notes.how_it_stopped`); the first request wins."""
        if self.stop_reason:
            return
        self.stop_reason = reason
        self.stop_facts = {"kind": kind, **facts}

    # ----- step bookkeeping ---------------------------------------------------------------
    def _step_closed(self, step: StepRecord) -> None:
        step.warmup = step.index < self.options.warmup
        if (
            step.index + 1 == max(self.options.warmup, 1)
            and self.hooks is not None
            and self.timeline.kind == "optimizer"
        ):
            self.hooks.narrow_to_roots()
        self.memory.close_step(step)
        if self.window is not None and self.settled():
            self.window.on_step_closed(step)
        self.emit("on_step_end", step)
        self.memory.open_step()
        self.timeline.restart_open_step()


class Attachment:
    """The runtime attached to this process: hooks installed, a record being filled.

    :func:`run_target` attaches around a script; the in-process API (``torchscalpel.profile``)
    attaches around a block of the user's own code. Both end in :meth:`detach`, which removes
    every hook, undoes every set-up hook and returns the finished Run record.
    """

    def __init__(
        self,
        options: RuntimeOptions,
        observers: Sequence[Observer] = (),
        setup_hooks: Sequence[SetupHook] = (),
        *,
        progress: Callable[[StepRecord], None] | None = None,
        command: Sequence[str] = (),
        target: dict[str, Any] | None = None,
    ) -> None:
        from torchscalpel.envcheck.facts import collect_facts
        from torchscalpel.runtime.eval_loss import EvalLossObserver
        from torchscalpel.runtime.module_times import ModuleTimes
        from torchscalpel.runtime.profiler_window import ProfilerWindow
        from torchscalpel.runtime.provenance import ProvenanceObserver
        from torchscalpel.runtime.sites import SitesObserver
        from torchscalpel.runtime.step_scalars import GradNormObserver, LearningRateObserver

        extra: list[Observer] = []
        self.module_timer = ModuleTimes() if options.module_times else None
        if self.module_timer is not None:
            extra.append(self.module_timer)
        if progress is not None:
            extra.append(_ProgressObserver(progress))
        extra.append(
            ProvenanceObserver((target or {}).get("script"), module=(target or {}).get("module"))
        )  # code, data, seeds: record.provenance
        extra.append(
            SitesObserver()
        )  # where the optimizer / DataLoader / model were built: scalpel fix edits there
        extra.append(EvalLossObserver())  # each evaluation pass's loss: sections["eval"]
        if options.step_scalars:
            extra.append(LearningRateObserver())  # per-step lr for --tensorboard / --mlflow
            extra.append(GradNormObserver())  # the norm clip_grad_norm_ returned, when the script clips
        self.options = options
        self.session = Session(options, [*observers, *extra])
        if options.profile_steps and options.out_dir is not None:
            self.session.window = ProfilerWindow(options, self.session)
        self.record = new_record(options, command=command, target=target or {}, environment=collect_facts())
        self._setup_hooks = list(setup_hooks)
        self._undo: list[Callable[[], None]] = []
        self.hooks = HookSet(self.session)
        self.session.hooks = self.hooks

    def attach(self) -> Session:
        """Run the set-up hooks, install the global hooks and start the first step."""
        for setup in self._setup_hooks:
            u = setup()
            if u is not None:
                self._undo.append(u)
        self.hooks.install()
        self.session.emit("on_start", self.session)
        self.session.memory.open_step()
        self.session.timeline.restart_open_step()
        return self.session

    def detach(
        self,
        status: RunStatus,
        exit_code: int = 0,
        error: str | None = None,
        *,
        exception: BaseException | None = None,
    ) -> RunRecord:
        """Remove every hook, close the last step and the profiler window; return the record.

        ``exception``: what a failed script raised, sent to the observers (``on_script_error``)."""
        session, record = self.session, self.record
        self.hooks.remove()
        for u in reversed(self._undo):
            try:
                u()
            except Exception as exc:  # an undo failing must not hide the run's own outcome
                session.notes.append(f"undoing a setup hook failed: {exc!r}")
        self._undo = []
        session._stopping = True
        if session.tail_started is not None:
            # the window's steps closed before the tail; nothing after them is a measured step
            if "tail_end" not in session.stop_facts:
                session.stop_facts["tail_ran_s"] = round(time.monotonic() - session.tail_started, 3)
                session.stop_facts["tail_end"] = "script"
        else:
            try:
                session.timeline.finish()
            except Exception as exc:
                session.notes.append(f"closing the last step failed: {exc!r}")
        if session.window is not None:
            session.window.close()
        record.status, record.exit_code, record.error = status, exit_code, error
        if session.stop_facts and status != "interrupted":
            # what ended the run, read by how_it_stopped: a record said "stopped" for a time cap and
            # for the planned steps alike
            record.config["stopped_by"] = {**session.stop_facts, "reason": session.stop_reason or error}
        record.step_kind = session.timeline.kind
        record.steps = session.timeline.steps
        if session.device is not None:
            record.config["device"] = str(session.device)
        record.config["clock"] = session.timeline.clock.kind
        if session.eval_forwards:
            session.notes.append(
                f"{session.eval_forwards} root forward(s) without grad were taken as evaluation: not steps, not forward time"
            )
        if not record.steps:
            session.notes.append(no_step_note(session))
        elif session.timeline.forced:
            session.notes.append(f"steps were delimited by {record.step_kind} calls, as --step-kind asked")
        elif record.step_kind != "optimizer":
            session.notes.append(no_optimizer_note(record.step_kind, status, record.steps))
        if session.stop_reason and session.stop_reason.startswith("no step was recognised"):
            session.notes.append(session.stop_reason)
        if self.module_timer is not None:
            record.modules = self.module_timer.table()
        if session.window is not None:
            record.profiler = session.window.result()
            record.findings.extend(f.to_dict() for f in session.window.findings())
        from torchscalpel.runtime.summary import summarize

        record.summary = summarize(record)
        if record.summary.get("samples_per_s_not_measured") and session.samples_unknown:
            # The runtime saw why: say that rather than the summary's generic reason.
            record.summary["samples_per_s_not_measured"] = "; ".join(session.samples_unknown.values())
        if exception is not None:
            session.emit("on_script_error", exception)
        session.emit("on_finish", record)
        record.notes = session.notes
        return record


def new_record(
    options: RuntimeOptions,
    *,
    command: Sequence[str],
    target: dict[str, Any],
    environment: dict[str, Any],
) -> RunRecord:
    """The Run record a run starts with: identity, environment and the options it ran under."""
    from torchscalpel.record import new_run_record
    from torchscalpel.sections import RunConfig

    return new_run_record(
        options.name,
        command=list(command),
        target=target,
        environment=environment,
        config=RunConfig(
            warmup=options.warmup,
            steps=options.steps,
            profile_steps=options.profile_steps,
            module_times=options.module_times,
            step_kind=options.step_kind,
        ).to_dict(),
    )


def run_target(
    target: Target,
    options: RuntimeOptions,
    observers: Sequence[Observer] = (),
    setup_hooks: Sequence[SetupHook] = (),
    *,
    progress: Callable[[StepRecord], None] | None = None,
    command: Sequence[str] = (),
) -> RunRecord:
    """Run ``target`` under the hooks; return its Run record (also on failure or Ctrl-C).

    The record's ``exit_code`` is what ``python SCRIPT`` would have exited with (0 when the
    runtime stopped it after the requested steps).
    """
    attachment = Attachment(
        options, observers, setup_hooks, progress=progress, command=command, target=target.to_dict()
    )
    try:
        outcome = run_script(
            target, ExecOptions(passthrough=(StopScript, MemoryLimitExceeded)), before=attachment.attach
        )
    except StopScript:
        return attachment.detach("stopped", 0, None)
    except MemoryLimitExceeded as exc:  # --memory-limit: a clean stop, explained by the memory section
        attachment.session.stop_facts = {"kind": "memory-limit"}
        return attachment.detach("failed", 1, str(exc))
    return attachment.detach(outcome.status, outcome.exit_code, outcome.error, exception=outcome.exception)


class _ProgressObserver(Observer):
    name = "progress"

    def __init__(self, callback: Callable[[StepRecord], None]) -> None:
        self.callback = callback

    def on_step_end(self, step: StepRecord) -> None:
        self.callback(step)

"""The torch.profiler window: a few measured steps profiled, exported as a gzipped Chrome trace.

The first measured step is the FLOP-counting step (:mod:`torchscalpel.runtime.flop_count`; the
profiler's own FLOP counts are not a step's FLOPs, so the window does not collect them). The window
opens after it, covers ``profile_steps`` steps, each wrapped in a ``ProfilerStep#N`` range like
torch.profiler's own schedule emits, and closes early if the script ends. Steps inside it are marked
``profiled`` and left out of the timing summary, since the profiler slows them down.

The window has a size budget in trace events (``profile_event_budget``). The counting step's op
count estimates a step's events; when the steps asked for would exceed the budget the window covers
fewer steps, then drops shapes and memory events, then cuts its one step short after a backward
call (a closure loop whose one step holds millions of ops: LBFGS over an unrolled LSTM), and last
profiles nothing. What it
did is recorded (``profiler.bounded``) and printed; the run itself always goes on.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from torchscalpel.record import StepRecord
from torchscalpel.runtime.flop_count import StepFlopCounter
from torchscalpel.runtime.native_log import LOG_NAME, native_stderr_to
from torchscalpel.runtime.observer import Observer
from torchscalpel.runtime.op_lines import OpLinePass, free_profiler

if TYPE_CHECKING:
    from torchscalpel.runtime.session import RuntimeOptions, Session

TRACE_NAME = "trace.json.gz"

EVENTS_PER_OP = 5.0
"""Trace events per dispatched aten op with shapes and memory recorded (measured 4.6 on the LBFGS
LSTMCell fixture, 5.7 on digits_cnn: the op, its composite parent, the autograd node, allocations)."""
EVENTS_PER_OP_LIGHT = 3.5
"""The same without shapes and memory (measured 2.9 on the LSTMCell loop)."""
CUDA_EVENTS_PER_OP = 2
"""Added per op on CUDA: a kernel and its launch."""


class _Boundaries(Observer):
    """Backward ends: where the counting step is measured and a window cut.

    Only backward: a forward listener would keep the global module hooks on for the whole run (see
    ``HookSet.narrow_to_roots``), slowing every measured step. A closure loop (LBFGS) has one backward
    per evaluation, which is where one step grows past any budget.
    """

    name = "profiler-window"

    def __init__(self, window: ProfilerWindow) -> None:
        self.window = window

    def on_backward_post(self, tensors: tuple[torch.Tensor, ...]) -> None:
        self.window.boundary()


class ProfilerWindow:
    """Starts and stops torch.profiler at step boundaries; summarises what it captured."""

    def __init__(self, options: RuntimeOptions, session: Session) -> None:
        self.options = options
        self.session = session
        w = options.warmup
        # The first measured step is the FLOP-counting step when there are enough of them.
        enough = options.steps is None or options.steps >= options.profile_steps + 1
        self.first = w + 1 if enough else w
        self.asked = options.profile_steps
        self.last = self.first + options.profile_steps - 1
        if options.steps is not None:
            self.last = min(self.last, w + options.steps - 1)
        self._prof: profile | None = None
        self._range: Any = None
        self._profiled: list[int] = []
        self._error: str | None = None
        self.trace_path: Path | None = None
        self._done = False
        self._shapes = True
        self._cut_after: int | None = None
        self._seen = 0
        self._cut_step: int | None = None
        self._step_index = -1
        self.bounded: str | None = None
        """What the budget made the window do, when it did anything."""
        self.estimate: int | None = None
        self.flops = StepFlopCounter(
            w if enough else None,
            None
            if enough
            else f"no measured step was left for counting beside the {options.profile_steps}-step "
            f"profiler window; run one more step (--steps {options.profile_steps + 1})",
            evaluating=lambda: session.hooks is not None and session.hooks.evaluating,
        )
        self.op_pass: OpLinePass | None = None
        """The op-line pass (:mod:`~torchscalpel.runtime.op_lines`), once the window has closed."""
        self._op_skipped: str | None = None
        self._pass_at: int | None = None
        """The step the op-line pass opens at: one step after the window's last (see :meth:`_plan_pass`)."""
        session.add_observer(_Boundaries(self))
        if self.first == 0:
            self._start(0)

    def on_step_closed(self, step: StepRecord) -> None:
        """Called at every settled step end: the FLOP step, then mark, open or close the window."""
        self.flops.on_step_closed(step)
        if self.op_pass is not None and self.op_pass.running:
            self.op_pass.on_step_closed(step)
        elif self._pass_at is not None and step.index + 1 == self._pass_at:
            self._pass_at = None
            self._start_pass(step.index + 1)
        elif self._cut_step == step.index:  # the step the budget cut short was profiled in part
            step.profiled, self._cut_step = True, None
            self._profiled.append(step.index)
        elif self._prof is not None:
            step.profiled = True
            self._profiled.append(step.index)
            self._close_range()
            if step.index >= self.last:
                self._close_window()
                self._plan_pass(step.index)
            else:
                self._open_range(step.index + 1)
        elif not self._done and step.index + 1 == self.first:
            self._start(step.index + 1)

    def boundary(self) -> None:
        """A backward ended: counted in the FLOP step; the cut point of a window cut short."""
        if self.flops.counting:
            self.flops.boundaries += 1
        elif self._prof is not None and self._cut_after is not None:
            self._seen += 1
            if self._seen >= self._cut_after:
                self._cut_step = self._step_index
                self.close()

    def _plan(self) -> bool:
        """Fit the window to the event budget from the counting step's op count; False: profile nothing."""
        budget, ops = self.options.profile_event_budget, self.flops.ops
        if not budget or ops is None:
            return True
        extra = CUDA_EVENTS_PER_OP if torch.cuda.is_available() else 0
        full, light = int(ops * (EVENTS_PER_OP + extra)), int(ops * (EVENTS_PER_OP_LIGHT + extra))
        self.estimate = full
        n = self.last - self.first + 1
        about = f"one step is about {full:,} trace events ({ops:,} ops), and the budget is {budget:,}"
        if full * n <= budget:
            return True
        if full <= budget:
            n = budget // full
            self.last = self.first + n - 1
            self.bounded = f"the profiler window covers {n} step(s), not {self.asked}: {about}"
        elif light <= budget:
            self.last, self._shapes = self.first, False
            self.bounded = f"the profiler window covers 1 step without shapes and memory: {about}"
        else:
            cuts = self.flops.boundaries
            if cuts < 2:  # one backward per step: nowhere to cut it before its end
                self._done = True
                self.bounded = (
                    f"no step was profiled: {about}, even without shapes and memory, and the step has one "
                    "backward call to cut it at; raise --profile-budget or profile a smaller configuration"
                )
                return False
            k = max(1, cuts * budget // light)  # at least the first evaluation
            self.last, self._shapes, self._cut_after = self.first, False, k
            self.bounded = (
                f"the profiler window covers part of 1 step without shapes and memory, cut short after "
                f"{k} of its {cuts} backward calls: {about}"
            )
        self.bounded += " (--profile-budget)"
        return True

    def restart(self) -> None:
        """Discard what the window captured and open it again at the first measured step.

        Called when a stronger step kind appears (the first optimizer step of a script that ran
        backward or forward calls before it): the steps the window covered were merged away, and
        the window must cover training steps.
        """
        if self._prof is not None:
            prof, self._prof = self._prof, None
            self._close_range()
            try:
                with native_stderr_to(self._log_path()):
                    prof.stop()
            except Exception as exc:
                self._error = f"profiler restart failed: {exc!r}"
        if self.op_pass is not None:
            self.op_pass.close()
        self.op_pass, self._op_skipped, self._pass_at = None, None, None
        self._profiled, self._done, self._cut_step, self._seen = [], False, None, 0
        self.flops.restart()
        if self.first == 0:
            self._start(0)

    def _start(self, next_index: int) -> None:
        if not self._plan():
            self.session.notes.append(self.bounded or "")
            return
        if self.bounded:
            self.session.notes.append(self.bounded)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        try:
            self._prof = profile(
                activities=activities,
                record_shapes=self._shapes or self.options.record_shapes,
                profile_memory=self._shapes,
                with_flops=False,
                with_stack=self.options.with_stack,
            )
            with native_stderr_to(self._log_path()):  # Kineto's USDT lines go to the run's log
                early = torch.empty(64)  # allocated before the window: freeing it inside triggers c10's
                self._prof.start()  # once-per-process "Memory block of unknown size" warning here,
                del early  # into the log, rather than in the middle of the user's output
            self._open_range(next_index)
        except Exception as exc:  # a profiler that cannot start must not stop the user's run
            self._prof, self._done, self._error = None, True, f"profiler failed to start: {exc!r}"

    def _log_path(self) -> Path | None:
        return self.options.out_dir / LOG_NAME if self.options.out_dir is not None else None

    def _open_range(self, index: int) -> None:
        self._step_index = index
        self._range = record_function(f"ProfilerStep#{index}")
        self._range.__enter__()

    def _close_range(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    def _plan_pass(self, last: int) -> None:
        """The window closed at the end of step ``last``: the op-line pass opens one step later.

        Not at once: the window closes inside the optimizer's ``Optimizer.step#...`` profiler range
        (the step-end hook runs within ``optimizer.step()``), which was entered while the window's
        profiler recorded. Ended while a second profiler session records, that range's end callback
        writes its end time into the first session's event storage, freed when it stopped: a
        use-after-free that corrupted the heap and segfaulted later, in the pass's ``prof.stop()``
        before run.json was written, or at interpreter exit in ``~vector<Result>`` (torch 2.13; 2 of
        30 runs of the terminal test's profile at load 2-7, 0 of 30 after). The step in between runs
        with no profiler, so every range opened under the window ends before the pass's profiler starts.
        """
        asked = self.options.op_line_steps
        if not asked or self._cut_step is not None:
            return
        if self._no_step_left(last + 2):
            return
        self._pass_at = last + 2

    def _no_step_left(self, index: int) -> bool:
        """True (and the reason kept) when step ``index`` is past the measured steps."""
        steps = self.options.steps
        if steps is None:
            return False
        end = self.options.warmup + steps - 1
        if index <= end:
            return False
        more = index + self.options.op_line_steps - 1 - end
        self._op_skipped = (
            f"no measured step was left after the profiler window for the op-line pass, which starts one "
            f"step after it (run {more} more: --steps {steps + more})"
        )
        return True

    def _start_pass(self, index: int) -> None:
        """Open the op-line pass at step ``index``, when it is asked for and measured steps are left."""
        asked = self.options.op_line_steps
        if not asked or self._cut_step is not None or self._no_step_left(index):
            return
        steps = self.options.steps
        end = self.options.warmup + steps - 1 if steps is not None else None
        n = asked if end is None else min(asked, end - index + 1)
        self.op_pass = OpLinePass(n, index, self._log_path())
        self.op_pass.start()

    def findings(self) -> list[Any]:
        """The op-line pass's pattern findings (:mod:`torchscalpel.trace.patterns`)."""
        return list(self.op_pass.findings) if self.op_pass is not None else []

    def close(self) -> None:
        """Stop the profiler and the op-line pass (idempotent), export the trace; stop a FLOP count cut short."""
        if self.op_pass is not None:
            self.op_pass.close()
        elif self._pass_at is not None:  # the script ended in the step between the window and the pass
            self._pass_at = None
            self._op_skipped = (
                "the script ended before the op-line pass, which starts one step after the window"
            )
        self._close_window()

    def _close_window(self) -> None:
        self.flops.close()
        if self._prof is None:
            return
        prof, self._prof, self._done = self._prof, None, True
        self._close_range()
        from torchscalpel.trace.counters import add_memory_counters

        try:
            with native_stderr_to(self._log_path()):
                prof.stop()
            if self.options.out_dir is not None:
                self.options.out_dir.mkdir(parents=True, exist_ok=True)
                self.trace_path = self.options.out_dir / TRACE_NAME
                prof.export_chrome_trace(str(self.trace_path))
                add_memory_counters(self.trace_path)  # memory as Perfetto counter tracks (trace/counters.py)
        except Exception as exc:
            self._error = f"profiler export failed: {exc!r}"
        finally:
            free_profiler(prof)  # now, not at interpreter exit (see op_lines.free_profiler)

    def result(self) -> dict[str, Any]:
        """The record's ``profiler`` section (the op summary is added by the trace module)."""
        out: dict[str, Any] = {
            "steps": self._profiled,
            "trace": self.trace_path.name if self.trace_path else None,
            **self.flops.result(),
        }
        if self.options.profile_event_budget:
            out["event_budget"] = self.options.profile_event_budget
        if self.estimate is not None:
            out["events_per_step_estimate"] = self.estimate
        if self.bounded:
            out["bounded"] = self.bounded
        if self._error:
            out["error"] = self._error
        if self.op_pass is not None:
            out["op_lines"] = self.op_pass.result()
        elif self._op_skipped:
            out["op_lines"] = {"steps": [], "error": self._op_skipped}
        return out

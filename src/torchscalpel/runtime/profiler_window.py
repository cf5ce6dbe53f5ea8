"""The torch.profiler window: a few measured steps profiled, exported as a gzipped Chrome trace.

The window opens after the first measured step (so one-off first-step work stays out), covers
``profile_steps`` steps, each wrapped in a ``ProfilerStep#N`` range like torch.profiler's own
schedule emits, and closes early if the script ends. Steps inside it are marked ``profiled`` and
left out of the timing summary, since the profiler slows them down. The step after the window is
the FLOP-counting step (:mod:`torchscalpel.runtime.flop_count`): the profiler's own FLOP counts
are not a step's FLOPs (no backward, autocast ops counted twice), so it does not collect them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from torchscalpel.record import StepRecord
from torchscalpel.runtime.flop_count import StepFlopCounter
from torchscalpel.runtime.native_log import LOG_NAME, native_stderr_to

if TYPE_CHECKING:
    from torchscalpel.runtime.session import RuntimeOptions, Session

TRACE_NAME = "trace.json.gz"


class ProfilerWindow:
    """Starts and stops torch.profiler at step boundaries; summarises what it captured."""

    def __init__(self, options: RuntimeOptions, session: Session) -> None:
        self.options = options
        self.session = session
        w = options.warmup
        # Leave the first measured step unprofiled when there are enough of them.
        enough = options.steps is None or options.steps >= options.profile_steps + 1
        self.first = w + 1 if enough else w
        self.last = self.first + options.profile_steps - 1
        if options.steps is not None:
            self.last = min(self.last, w + options.steps - 1)
        self._prof: profile | None = None
        self._range: Any = None
        self._profiled: list[int] = []
        self._error: str | None = None
        self.trace_path: Path | None = None
        self._done = False
        # The FLOP-counting step: the first one after the window, inside the measured steps.
        end = w + options.steps - 1 if options.steps is not None else None
        self.flops = StepFlopCounter(session, self.last + 1, end)
        if self.first == 0:
            self._start(0)

    def on_step_closed(self, step: StepRecord) -> None:
        """Called at every settled step end: mark, open or close the window; then the FLOP step."""
        if self._prof is not None:
            step.profiled = True
            self._profiled.append(step.index)
            self._close_range()
            if step.index >= self.last:
                self.close()
            else:
                self._open_range(step.index + 1)
        elif not self._done and step.index + 1 == self.first:
            self._start(step.index + 1)
        self.flops.on_step_closed(step, window_open=self._prof is not None)

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
        self._profiled, self._done = [], False
        self.flops.restart()
        if self.first == 0:
            self._start(0)

    def _start(self, next_index: int) -> None:
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        try:
            self._prof = profile(
                activities=activities, record_shapes=True, profile_memory=True, with_flops=False, with_stack=False
            )
            with native_stderr_to(self._log_path()):  # Kineto's USDT lines go to the run's log
                early = torch.empty(64)  # allocated before the window: freeing it inside triggers c10's
                self._prof.start()       # once-per-process "Memory block of unknown size" warning here,
                del early                # into the log, rather than in the middle of the user's output
            self._open_range(next_index)
        except Exception as exc:  # a profiler that cannot start must not stop the user's run
            self._prof, self._done, self._error = None, True, f"profiler failed to start: {exc!r}"

    def _log_path(self) -> Path | None:
        return self.options.out_dir / LOG_NAME if self.options.out_dir is not None else None

    def _open_range(self, index: int) -> None:
        self._range = record_function(f"ProfilerStep#{index}")
        self._range.__enter__()

    def _close_range(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    def close(self) -> None:
        """Stop the profiler (idempotent) and export the trace; stop a FLOP count cut short."""
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

    def result(self) -> dict[str, Any]:
        """The record's ``profiler`` section (the op summary is added by the trace module)."""
        out: dict[str, Any] = {
            "steps": self._profiled,
            "trace": self.trace_path.name if self.trace_path else None,
            **self.flops.result(),
        }
        if self._error:
            out["error"] = self._error
        return out


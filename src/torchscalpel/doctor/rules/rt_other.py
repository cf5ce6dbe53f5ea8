"""Runtime rule for the "other" phase: step time outside data, forward, backward and the optimizer, with the
user's lines that spend it (logging, ``.item()`` / ``.cpu()`` syncs, metrics, validation inside the loop).

The runtime splits each step into its five phases (:data:`torchscalpel.record.PHASES`); "other" is what is
left. To say *which* lines, a sampling thread reads the script thread's stack every few milliseconds during
the measured steps: a sample inside a phase counts for the phases, one taken while the runtime's observers
run (a ``Session.emit`` frame on the stack: the doctor's own bookkeeping) counts for nothing, and any other
counts for "other" with its innermost user line. The share is of samples taken within the same steps, so a
loaded machine shifts it little; the verdict needs it to be large.
"""

from __future__ import annotations

import linecache
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.runtime_rules import RuntimeRule
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.userframes import user_frame

OTHER_PHASE_HEAVY = RuleInfo(
    slug="other-phase-heavy",
    severity=Severity.INFO,
    category="performance",
    summary="most of the step is outside data, forward, backward and the optimizer: the lines that spend it",
    kinds=("runtime",),
)

SAMPLE_S = 0.002
"""How often the sampling thread reads the script's stack (the interpreter's switch interval bounds it)."""
MIN_SHARE = 0.6
"""The "other" share of the measured step's samples (the doctor's own bookkeeping left out) from which the
rule speaks: a small script's loss, ``zero_grad`` and batch slicing stay below it."""
MIN_STEPS = 10
"""Measured steps needed before anything is said."""
MIN_SAMPLES = 20
"""Samples outside the phases needed to name lines."""
TOP_LINES = 3
_SYNC_HINTS = {
    ".item()": "keep the value as a tensor and call .item() only on the steps you log",
    ".cpu()": "move it to the host only on the steps you log",
    ".tolist()": "convert only on the steps you log",
    ".numpy()": "convert only on the steps you log",
    "print(": "print every N steps (if step % N == 0)",
    "no_grad": "run the validation every K steps or once per epoch, not inside each step",
    "eval": "run the validation every K steps or once per epoch, not inside each step",
}


def _observing(frame: Any) -> bool:
    """The runtime's observers are running (a ``Session.emit`` frame on the stack): the doctor's time."""
    depth = 0
    while frame is not None and depth < 80:
        code = frame.f_code
        if code.co_name == "emit" and code.co_filename.replace("\\", "/").endswith("runtime/session.py"):
            return True
        frame = frame.f_back
        depth += 1
    return False


def _read(target: int) -> tuple[str, int] | None:
    """The innermost user line of thread ``target`` (``("", 0)``: none), None while the runtime's observers run
    or the thread is gone. No frame outlives this call: a frame kept by the sampler would keep its locals, and
    so the script's autograd graphs, alive past their step (what ``loss-graph-retained`` watches)."""
    frame = sys._current_frames().get(target)
    try:
        if frame is None or _observing(frame):
            return None
        found = user_frame(frame, max_depth=80)
        return ("", 0) if found is None else (found.f_code.co_filename, found.f_lineno)
    finally:
        del frame


class OtherPhaseHeavy(RuntimeRule):
    """Samples the script thread outside the phases of the measured steps; reports the heaviest user lines
    when "other" is at least half of the step time."""

    info = OTHER_PHASE_HEAVY

    def __init__(self) -> None:
        super().__init__()
        self.lines: Counter[tuple[str, int]] = Counter()
        self.samples = 0
        """Samples outside the phases (the doctor's own work left out)."""
        self.in_phases = 0
        self.other_ms = 0.0
        self.total_ms = 0.0
        self.steps = 0
        self._measuring = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._target: int | None = None

    def on_start(self, session: Any) -> None:
        self._target = threading.get_ident()
        self._measuring = getattr(getattr(session, "options", None), "warmup", 0) == 0
        self._thread = threading.Thread(target=self._sample, name="scalpel-other-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        session, target = self.session, self._target
        timeline = getattr(session, "timeline", None)
        while not self._stop.wait(SAMPLE_S):
            if (
                not self._measuring
                or timeline is None
                or target is None
                or getattr(session, "tail_started", None) is not None
            ):
                continue
            seen = _read(target)
            if seen is None:
                continue
            if timeline.in_phase is not None:
                self.in_phases += 1
                continue
            self.samples += 1
            if seen != ("", 0):
                self.lines[seen] += 1

    def on_step_end(self, step: Any) -> None:
        if not getattr(step, "warmup", False):
            self.steps += 1
            self.other_ms += float(getattr(step, "other_ms", 0.0) or 0.0)
            self.total_ms += float(getattr(step, "total_ms", 0.0) or 0.0)
        warmup = getattr(getattr(self.session, "options", None), "warmup", 0) or 0
        self._measuring = step.index + 1 >= warmup

    def on_finish(self, record: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.steps < MIN_STEPS or self.total_ms <= 0 or self.samples < MIN_SAMPLES or not self.lines:
            return
        share = self.samples / (self.samples + self.in_phases)
        if share < MIN_SHARE:
            return
        top = self.lines.most_common(TOP_LINES)
        named = []
        hints: list[str] = []
        for (file, line), count in top:
            text = linecache.getline(file, line).strip()
            named.append(f"{file}:{line} ({100 * count / self.samples:.0f}% of the samples): {text}")
            hints += [h for key, h in _SYNC_HINTS.items() if key in text and h not in hints]
        evals = int(getattr(self.session, "eval_forwards", 0) or 0)
        # an evaluation forward (or more) for every training step: validation inside the step
        if evals >= self.steps:
            hints.append(
                f"{evals} evaluation forwards over {self.steps} measured steps: "
                "run the validation every K steps or once per epoch, not inside each step"
            )
        (file, line), _ = top[0]
        fix = (
            "\n".join(f"# {h}" for h in hints) or "# do this work every N steps, or outside the training loop"
        )
        yield OTHER_PHASE_HEAVY.finding(
            f"{100 * share:.0f}% of the measured steps' time is spent outside data loading, forward, backward and the "
            "optimizer (logging, host syncs such as .item(), metrics, validation in the loop): the lines below "
            "spend most of it.",
            evidence=[
                f"other: {self.samples} of {self.samples + self.in_phases} stack samples over {self.steps} measured "
                f"steps ({self.other_ms / self.steps:.2f} ms of {self.total_ms / self.steps:.2f} ms per step, the "
                "doctor's own bookkeeping included)",
                *named,
            ],
            fix=fix,
            location=Location(file=file, line=line),
        )

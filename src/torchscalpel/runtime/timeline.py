"""Step segmentation: turns a stream of phase events into :class:`StepRecord` rows.

Phases are nested in real scripts (a forward inside an optimizer closure, a checkpointed
forward recomputed inside backward); only the outermost phase counts, so every millisecond is
attributed once and the five phases sum to the step time, with ``other`` as the remainder.

Steps are delimited by the strongest boundary seen so far: optimizer steps if any optimizer has
stepped, else backward calls (hand-written updates), else root-module forward calls
(inference). When a stronger kind appears, the steps closed under the weaker one are merged
into the open step, so the first real training step absorbs any set-up forwards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchscalpel.record import StepRecord
from torchscalpel.runtime.clock import Clock

KIND_RANK = {"forward": 0, "backward": 1, "optimizer": 2}
PHASE_FIELDS = {"data": "data_ms", "forward": "forward_ms", "backward": "backward_ms", "optimizer": "optimizer_ms"}


@dataclass(slots=True)
class _OpenStep:
    start: Any
    spans: list[tuple[str, Any, Any]] = field(default_factory=list)
    losses: list[Any] = field(default_factory=list)
    micro_batches: int = 0
    forward_calls: int = 0
    samples: int | None = None
    batch_samples: int | None = None
    merged_ms: dict[str, float] = field(default_factory=dict)
    merged_total_ms: float = 0.0
    merged_counts: tuple[int, int] = (0, 0)


class Timeline:
    """Accumulates phase spans and closes steps at boundaries of the current step kind."""

    def __init__(self, clock: Clock, on_close: Callable[[StepRecord], None] | None = None) -> None:
        self.clock = clock
        self.kind = "forward"
        self.steps: list[StepRecord] = []
        self.origin = clock.mark()
        self._origin_offset_ms = 0.0  # time on earlier clocks before ``origin`` (see switch_clock)
        self._open = _OpenStep(start=self.origin)
        self._phase: str | None = None
        self._phase_start: Any = None
        self._depth = 0
        self._primary_optimizer: int | None = None
        self._on_close = on_close
        self.loss_reader: Callable[[Any], float | None] = _loss_value

    def switch_clock(self, clock: Clock) -> None:
        """Measure with ``clock`` from now on (the script moved its model to a GPU mid-run).

        Marks from two clocks cannot be subtracted (a float and a CUDA event), so everything the
        old clock measured is settled now: the open step's finished spans and its time so far
        become merged milliseconds, an open phase restarts on the new clock, and step start
        times stay continuous through an offset.
        """
        if type(clock) is type(self.clock) and getattr(clock, "device", None) == getattr(self.clock, "device", None):
            return
        old = self.clock
        now = old.mark()
        old.resolve(now)
        o = self._open
        for name, a, b in o.spans:
            o.merged_ms[name] = o.merged_ms.get(name, 0.0) + old.elapsed_ms(a, b)
        o.spans = []
        if self._depth and self._phase is not None:
            o.merged_ms[self._phase] = o.merged_ms.get(self._phase, 0.0) + old.elapsed_ms(self._phase_start, now)
        o.merged_total_ms += old.elapsed_ms(o.start, now)
        self._origin_offset_ms += old.elapsed_ms(self.origin, now)
        self.clock = clock
        self.origin = clock.mark()
        o.start = self.origin
        if self._depth and self._phase is not None:
            self._phase_start = self.origin

    # ----- phases -------------------------------------------------------------------------
    def begin(self, phase: str) -> bool:
        """Enter ``phase``; returns True if it is the outermost phase (and so is timed)."""
        self._depth += 1
        if self._depth > 1:
            return False
        self._phase = phase
        self._phase_start = self.clock.mark()
        return True

    def end(self, phase: str) -> None:
        """Leave the phase entered by the matching :meth:`begin`."""
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._phase is not None:
            self._open.spans.append((self._phase, self._phase_start, self.clock.mark()))
            self._phase = None

    @property
    def in_phase(self) -> str | None:
        """The outermost phase currently open, if any."""
        return self._phase if self._depth else None

    # ----- facts about the open step ------------------------------------------------------
    def note_forward(self, samples: int | None) -> None:
        """A root forward call happened: counted, and its batch size added to the step's samples."""
        self._open.forward_calls += 1
        if samples is not None:
            self._open.samples = (self._open.samples or 0) + samples

    def note_batch(self, samples: int | None) -> None:
        """A DataLoader batch arrived; its size counts when forwards take keyword-only inputs."""
        if samples is not None:
            self._open.batch_samples = (self._open.batch_samples or 0) + samples

    def note_loss(self, loss: Any) -> None:
        """Backward was called on ``loss`` (a detached tensor or a float)."""
        self._open.losses.append(loss)
        self._open.micro_batches += 1

    # ----- boundaries ---------------------------------------------------------------------
    def boundary(self, kind: str, optimizer_id: int | None = None) -> StepRecord | None:
        """A possible step end of ``kind``; closes and returns the step if it is one."""
        if KIND_RANK[kind] > KIND_RANK[self.kind]:
            self._merge_closed_into_open()
            self.kind = kind
        if kind != self.kind:
            return None
        if kind == "optimizer":
            # Several optimizers (GANs, per-group optimizers) step in one iteration: the first
            # one seen delimits steps, the others' time stays inside the step.
            if self._primary_optimizer is None:
                self._primary_optimizer = optimizer_id
            elif optimizer_id != self._primary_optimizer:
                return None
        return self._close()

    def finish(self) -> StepRecord | None:
        """Close a trailing partial step if it holds any measured work (script ended)."""
        if self._depth:
            self.end(self._phase or "other")
            self._depth = 0
        # Data-only leftovers (the fetch that raised StopIteration) are not a step.
        if self._open.losses or any(name != "data" for name, _, _ in self._open.spans):
            return self._close()
        return None

    def _close(self) -> StepRecord:
        end = self.clock.mark()
        self.clock.resolve(end)
        open_step = self._open
        phases = dict.fromkeys(PHASE_FIELDS, 0.0)
        for name, a, b in open_step.spans:
            phases[name] = phases.get(name, 0.0) + self.clock.elapsed_ms(a, b)
        for name, ms in open_step.merged_ms.items():
            phases[name] = phases.get(name, 0.0) + ms
        total = self.clock.elapsed_ms(open_step.start, end) + open_step.merged_total_ms
        losses = [v for v in (self.loss_reader(x) for x in open_step.losses) if v is not None]
        step = StepRecord(
            index=len(self.steps),
            start_ms=self._origin_offset_ms
            + self.clock.elapsed_ms(self.origin, open_step.start)
            - open_step.merged_total_ms,
            total_ms=total,
            data_ms=phases["data"],
            forward_ms=phases["forward"],
            backward_ms=phases["backward"],
            optimizer_ms=phases["optimizer"],
            other_ms=max(total - sum(phases.values()), 0.0),
            loss=losses[-1] if losses else None,
            micro_batches=open_step.micro_batches + open_step.merged_counts[0],
            forward_calls=open_step.forward_calls + open_step.merged_counts[1],
            samples=open_step.samples if open_step.samples is not None else open_step.batch_samples,
        )
        self.steps.append(step)
        self._open = _OpenStep(start=end)
        if self._on_close is not None:
            self._on_close(step)
        return step

    def restart_open_step(self) -> None:
        """Start the open step now: bookkeeping done between steps (profiler export) is not the script's time."""
        if not self._open.spans and not self._depth:
            self._open.start = self.clock.mark()

    def _merge_closed_into_open(self) -> None:
        """Fold steps closed under a weaker kind back into the open step."""
        if not self.steps:
            return
        merged = self.steps
        self.steps = []
        o = self._open
        for s in merged:
            for name, fld in PHASE_FIELDS.items():
                o.merged_ms[name] = o.merged_ms.get(name, 0.0) + getattr(s, fld)
            o.merged_total_ms += s.total_ms
            o.merged_counts = (o.merged_counts[0] + s.micro_batches, o.merged_counts[1] + s.forward_calls)
            if s.samples is not None:
                o.samples = (o.samples or 0) + s.samples
            if s.loss is not None:
                o.losses.insert(0, s.loss)


def _loss_value(loss: Any) -> float | None:
    """A float from whatever backward was called on (mean of a non-scalar tensor)."""
    if loss is None:
        return None
    if isinstance(loss, int | float):
        return float(loss)
    try:
        value = loss.float().mean() if loss.numel() != 1 else loss
        return float(value.item())
    except Exception:
        return None

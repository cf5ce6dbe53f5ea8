"""Step segmentation: turns a stream of phase events into :class:`StepRecord` rows.

Phases nest in real scripts: a closure's forward and backward run inside ``optimizer.step``
(LBFGS, every Lightning script), a checkpointed block's forward is recomputed inside backward,
a script may fetch a batch inside its closure. Time is attributed to the *innermost* phase, so a
closure's forward counts as forward and the optimizer phase keeps only the update itself, with
one exception: a forward inside backward is recomputation and stays backward. Every millisecond
is attributed once, and the five phases sum to the step time, with ``other`` as the remainder.

Steps are delimited by the strongest boundary seen so far: optimizer steps if any optimizer has
stepped, else backward calls (hand-written updates), else root-module forward calls
(inference). When a stronger kind appears, the steps closed under the weaker one are merged
into the open step, so the first real training step absorbs any set-up forwards. A run may also
fix the kind up front (``forced_kind``), and then no other kind delimits steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchscalpel.record import StepRecord
from torchscalpel.runtime.clock import Clock

KIND_RANK = {"forward": 0, "backward": 1, "optimizer": 2}
PHASE_FIELDS = {
    "data": "data_ms",
    "forward": "forward_ms",
    "backward": "backward_ms",
    "optimizer": "optimizer_ms",
}


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
    merged_samples: int | None = None
    closure_evals: int = 0
    """Backward calls that ended inside the optimizer phase (closure evaluations, e.g. LBFGS)."""
    recomputed_forwards: int = 0
    """Root-level forwards run inside backward (activation checkpointing's recomputation)."""
    skipped_update: bool = False
    """GradScaler skipped the optimizer update of this step (inf/NaN gradients)."""
    eval_spans: list[tuple[Any, Any]] = field(default_factory=list)
    """Evaluation forwards (start, end marks): time inside ``other``, kept apart for FLOP/s."""
    merged_eval_ms: float = 0.0


class Timeline:
    """Accumulates phase spans and closes steps at boundaries of the current step kind."""

    def __init__(
        self,
        clock: Clock,
        on_close: Callable[[StepRecord], None] | None = None,
        *,
        forced_kind: str | None = None,
        on_kind_change: Callable[[str], None] | None = None,
    ) -> None:
        if forced_kind is not None and forced_kind not in KIND_RANK:
            raise ValueError(f"step kind must be one of {', '.join(KIND_RANK)}, not {forced_kind!r}")
        self.clock = clock
        self.kind = forced_kind or "forward"
        self.forced = forced_kind is not None
        self.steps: list[StepRecord] = []
        self.origin = clock.mark()
        self._origin_offset_ms = 0.0  # time on earlier clocks before ``origin`` (see switch_clock)
        self._open = _OpenStep(start=self.origin)
        self._stack: list[str] = []
        """Attributed phase of every open begin(), outermost first."""
        self._phase: str | None = None
        """The phase the running span is attributed to (the innermost), None between phases."""
        self._phase_start: Any = None
        self._primary_optimizer: int | None = None
        self._on_close = on_close
        self._on_kind_change = on_kind_change
        self.loss_reader: Callable[[Any], float | None] = _loss_value

    def switch_clock(self, clock: Clock) -> None:
        """Measure with ``clock`` from now on (the script moved its model to a GPU mid-run).

        Marks from two clocks cannot be subtracted (a float and a CUDA event), so everything the
        old clock measured is settled now: the open step's finished spans and its time so far
        become merged milliseconds, an open phase restarts on the new clock, and step start
        times stay continuous through an offset.
        """
        if type(clock) is type(self.clock) and getattr(clock, "device", None) == getattr(
            self.clock, "device", None
        ):
            return
        old = self.clock
        now = old.mark()
        old.resolve(now)
        o = self._open
        for name, a, b in o.spans:
            o.merged_ms[name] = o.merged_ms.get(name, 0.0) + old.elapsed_ms(a, b)
        o.spans = []
        o.merged_eval_ms += sum(old.elapsed_ms(a, b) for a, b in o.eval_spans)
        o.eval_spans = []
        if self._phase is not None:
            o.merged_ms[self._phase] = o.merged_ms.get(self._phase, 0.0) + old.elapsed_ms(
                self._phase_start, now
            )
        o.merged_total_ms += old.elapsed_ms(o.start, now)
        self._origin_offset_ms += old.elapsed_ms(self.origin, now)
        self.clock = clock
        self.origin = clock.mark()
        o.start = self.origin
        if self._phase is not None:
            self._phase_start = self.origin

    # ----- phases ----------------------------------------------------------------------------
    def begin(self, phase: str) -> bool:
        """Enter ``phase``; returns True if it is the outermost phase (nothing else was open)."""
        outermost = not self._stack
        # A forward inside backward is checkpointing's recomputation: it is backward's cost.
        attributed = "backward" if phase == "forward" and "backward" in self._stack else phase
        self._stack.append(attributed)
        if attributed != self._phase:
            self._switch(attributed)
        return outermost

    def end(self, phase: str) -> None:
        """Leave the phase entered by the matching :meth:`begin`; the enclosing phase resumes."""
        if not self._stack:
            return
        self._stack.pop()
        resumed = self._stack[-1] if self._stack else None
        if resumed != self._phase:
            self._switch(resumed)

    @property
    def depth(self) -> int:
        """How many phases are open (for :meth:`end_to`)."""
        return len(self._stack)

    def end_to(self, depth: int) -> None:
        """Leave every phase opened above ``depth``: a wrapper's exit when what ran inside raised before its inner
        phases ended (a checkpointed block's recomputed forward that raised inside backward). A script that
        catches the error and goes on must not have its next forward counted as recomputation."""
        if len(self._stack) <= depth:
            return
        del self._stack[depth:]
        resumed = self._stack[-1] if self._stack else None
        if resumed != self._phase:
            self._switch(resumed)

    def _switch(self, phase: str | None) -> None:
        """End the running span now and start one attributed to ``phase`` (None: between phases)."""
        now = self.clock.mark()
        if self._phase is not None:
            self._open.spans.append((self._phase, self._phase_start, now))
        self._phase, self._phase_start = phase, now

    @property
    def in_phase(self) -> str | None:
        """The outermost phase currently open, if any (boundaries happen only outside phases)."""
        return self._stack[0] if self._stack else None

    def inside(self, phase: str) -> bool:
        """True if ``phase`` is open at any depth (a closure's forward is inside the optimizer)."""
        return phase in self._stack

    # ----- facts about the open step ------------------------------------------------------
    def note_forward(self, samples: int | None) -> None:
        """A root training forward happened: counted, and its batch size added to the step's samples.

        Inside a closure only the first evaluation counts: LBFGS re-evaluates the same batch.
        """
        o = self._open
        if self.inside("optimizer") and o.closure_evals:
            return
        o.forward_calls += 1
        if samples is not None:
            o.samples = (o.samples or 0) + samples

    def note_recompute(self) -> None:
        """A root-level forward ran inside backward (checkpoint recomputation): not a new forward."""
        self._open.recomputed_forwards += 1

    def note_batch(self, samples: int | None) -> None:
        """A training DataLoader batch arrived; the step's samples are these batches' sizes when any came."""
        if samples is not None:
            self._open.batch_samples = (self._open.batch_samples or 0) + samples

    def note_loss(self, loss: Any) -> None:
        """Backward returned for ``loss`` (a detached tensor or a float).

        The step's loss is the sum of its micro-batches' losses (what a script under gradient
        accumulation prints); in a closure, only the first evaluation's (what ``step`` returns).
        """
        o = self._open
        if self.inside("optimizer"):
            o.closure_evals += 1
            if o.closure_evals > 1:
                return
        o.losses.append(loss)
        o.micro_batches += 1

    def note_eval(self, start: Any, end: Any) -> None:
        """An evaluation forward ran from ``start`` to ``end`` (marks of this timeline's clock): not a step, not
        a phase (its time stays in ``other``), but kept apart so FLOP/s is over the training time."""
        self._open.eval_spans.append((start, end))

    def note_skipped_update(self) -> None:
        """GradScaler skipped this step's optimizer update (the step still ends here)."""
        self._open.skipped_update = True

    # ----- boundaries ---------------------------------------------------------------------
    def boundary(self, kind: str, optimizer_id: int | None = None) -> StepRecord | None:
        """A possible step end of ``kind``; closes and returns the step if it is one."""
        if not self.forced and KIND_RANK[kind] > KIND_RANK[self.kind]:
            self._merge_closed_into_open()
            self.kind = kind
            if self._on_kind_change is not None:
                self._on_kind_change(kind)
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

    @property
    def primary_optimizer(self) -> int | None:
        """The id of the optimizer whose steps delimit steps (the first one seen), None before any."""
        return self._primary_optimizer

    def adopt_primary(self, optimizer_id: int) -> None:
        """Let ``optimizer_id`` delimit steps from now on: the primary optimizer is gone (a script that builds a
        new optimizer per fold or per run), so its steps would otherwise never end a step again."""
        self._primary_optimizer = optimizer_id

    def finish(self) -> StepRecord | None:
        """Close a trailing partial step if it holds any measured work (script ended)."""
        while self._stack:
            self.end(self._stack[-1])
        # Data-only leftovers (the fetch that raised StopIteration) are not a step.
        if self._open.losses or any(name != "data" for name, _, _ in self._open.spans):
            return self._close()
        return None

    def _close(self) -> StepRecord:
        end = self.clock.mark()
        self.clock.resolve(end)
        open_step = self._open
        if self._phase is not None:
            # A step that closes while a phase is still open (a checkpointed block's recomputed forward raised
            # inside backward, so its end never came and backward's stays open under it) keeps the phase's time
            # up to now; the rest goes to the next step. Left running, the whole span went to the next step,
            # which then held more phase time than its own total.
            open_step.spans.append((self._phase, self._phase_start, end))
            self._phase_start = end
        phases = dict.fromkeys(PHASE_FIELDS, 0.0)
        for name, a, b in open_step.spans:
            phases[name] = phases.get(name, 0.0) + self.clock.elapsed_ms(a, b)
        for name, ms in open_step.merged_ms.items():
            phases[name] = phases.get(name, 0.0) + ms
        total = self.clock.elapsed_ms(open_step.start, end) + open_step.merged_total_ms
        eval_ms = open_step.merged_eval_ms + sum(self.clock.elapsed_ms(a, b) for a, b in open_step.eval_spans)
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
            loss=sum(losses) if losses else None,
            micro_batches=open_step.micro_batches + open_step.merged_counts[0],
            forward_calls=open_step.forward_calls + open_step.merged_counts[1],
            samples=_step_samples(open_step),
            closure_evals=open_step.closure_evals,
            recomputed_forwards=open_step.recomputed_forwards,
            skipped_update=open_step.skipped_update,
            eval_ms=min(eval_ms, total),
        )
        self.steps.append(step)
        self._open = _OpenStep(start=end)
        if self._on_close is not None:
            self._on_close(step)
        return step

    def restart_open_step(self) -> None:
        """Start the open step now: bookkeeping done between steps (profiler export) is not the script's time."""
        if not self._open.spans and not self._stack:
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
                o.merged_samples = (o.merged_samples or 0) + s.samples
            if s.loss is not None:
                o.losses.insert(0, s.loss)
            o.recomputed_forwards += s.recomputed_forwards
            o.merged_eval_ms += s.eval_ms


def _step_samples(o: _OpenStep) -> int | None:
    """Samples of a step: its training batches' sizes when a DataLoader fed it, else its model inputs'."""
    own = o.batch_samples if o.batch_samples is not None else o.samples
    if own is None and o.merged_samples is None:
        return None
    return (own or 0) + (o.merged_samples or 0)


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

"""Step segmentation on a fake clock: exact numbers, no timing."""

from __future__ import annotations

import pytest

from torchscalpel.runtime.clock import Clock
from torchscalpel.runtime.timeline import Timeline


class FakeClock(Clock):
    """Time advances only when the test says so."""

    kind = "fake"

    def __init__(self) -> None:
        self.now = 0.0

    def mark(self) -> float:
        return self.now

    def elapsed_ms(self, start: float, end: float) -> float:
        return end - start

    def tick(self, ms: float) -> None:
        self.now += ms


def _phase(tl: Timeline, clock: FakeClock, name: str, ms: float) -> None:
    tl.begin(name)
    clock.tick(ms)
    tl.end(name)


def _train_step(tl: Timeline, clock: FakeClock, micro: int = 1, opt_id: int = 1) -> None:
    for _ in range(micro):
        _phase(tl, clock, "data", 1)
        tl.begin("forward")
        clock.tick(3)
        tl.note_forward(8)
        tl.end("forward")
        tl.boundary("forward")
        _phase(tl, clock, "backward", 5)
        tl.note_loss(2.5)
        tl.boundary("backward")
    clock.tick(0.5)  # zero_grad, logging: "other"
    _phase(tl, clock, "optimizer", 2)
    tl.boundary("optimizer", opt_id)


def test_optimizer_steps_split_into_five_phases_that_sum_to_the_step():
    clock = FakeClock()
    tl = Timeline(clock)
    for _ in range(3):
        _train_step(tl, clock)
    assert tl.kind == "optimizer"
    assert len(tl.steps) == 3
    s = tl.steps[1]
    assert (s.data_ms, s.forward_ms, s.backward_ms, s.optimizer_ms) == (1, 3, 5, 2)
    assert s.other_ms == pytest.approx(0.5)
    assert s.total_ms == pytest.approx(11.5)
    assert s.loss == 2.5 and s.micro_batches == 1 and s.samples == 8


def test_gradient_accumulation_is_one_step_with_several_micro_batches():
    clock = FakeClock()
    tl = Timeline(clock)
    _train_step(tl, clock, micro=4)
    _train_step(tl, clock, micro=4)
    assert len(tl.steps) == 2
    assert tl.steps[0].micro_batches == 4
    assert tl.steps[1].micro_batches == 4
    assert tl.steps[1].forward_calls == 4
    assert tl.steps[1].backward_ms == 20
    assert tl.steps[1].total_ms == pytest.approx(4 * 9 + 2.5)


def test_first_step_absorbs_forward_steps_seen_before_the_first_backward():
    clock = FakeClock()
    tl = Timeline(clock)
    _phase(tl, clock, "forward", 7)  # a sanity-check forward before training
    tl.boundary("forward")
    assert len(tl.steps) == 1
    _train_step(tl, clock)
    assert len(tl.steps) == 1
    assert tl.steps[0].forward_ms == 10
    assert tl.steps[0].total_ms == pytest.approx(18.5)


def test_inference_only_steps_are_root_forward_calls():
    clock = FakeClock()
    tl = Timeline(clock)
    for _ in range(5):
        _phase(tl, clock, "data", 1)
        _phase(tl, clock, "forward", 4)
        tl.boundary("forward")
    assert tl.kind == "forward"
    assert [s.total_ms for s in tl.steps] == [5, 5, 5, 5, 5]


def test_a_closure_forward_and_backward_are_attributed_to_their_phases():
    clock = FakeClock()
    tl = Timeline(clock)
    tl.begin("optimizer")  # e.g. LBFGS: the closure runs forward and backward inside step()
    clock.tick(1)
    for _ in range(3):  # three closure evaluations in one step
        _phase(tl, clock, "forward", 3)
        tl.begin("backward")
        clock.tick(4)
        tl.end("backward")
        tl.note_loss(2.0)
    clock.tick(2)
    tl.end("optimizer")
    step = tl.boundary("optimizer", 1)
    assert step is not None
    assert (step.forward_ms, step.backward_ms, step.optimizer_ms, step.total_ms) == (9, 12, 3, 24)
    assert step.closure_evals == 3 and step.micro_batches == 1 and step.loss == 2.0


def test_a_forward_inside_backward_is_recomputation_and_counts_as_backward():
    clock = FakeClock()
    tl = Timeline(clock)
    _phase(tl, clock, "forward", 3)
    tl.begin("backward")
    clock.tick(1)
    _phase(tl, clock, "forward", 2)  # torch.utils.checkpoint re-runs the block's forward
    clock.tick(1)
    tl.end("backward")
    _phase(tl, clock, "optimizer", 1)
    step = tl.boundary("optimizer", 1)
    assert step is not None
    assert (step.forward_ms, step.backward_ms, step.optimizer_ms) == (3, 4, 1)


def test_accumulated_losses_are_summed():
    clock = FakeClock()
    tl = Timeline(clock)
    for value in (0.5, 0.25, 1.0):
        _phase(tl, clock, "backward", 1)
        tl.note_loss(value)
        tl.boundary("backward")
    _phase(tl, clock, "optimizer", 1)
    step = tl.boundary("optimizer", 1)
    assert step is not None and step.loss == 1.75 and step.micro_batches == 3


def test_a_forced_kind_never_changes():
    clock = FakeClock()
    tl = Timeline(clock, forced_kind="backward")
    _phase(tl, clock, "backward", 1)
    assert tl.boundary("backward") is not None
    _phase(tl, clock, "optimizer", 1)
    assert tl.boundary("optimizer", 1) is None and tl.kind == "backward"
    with pytest.raises(ValueError, match="step kind"):
        Timeline(clock, forced_kind="epoch")


def test_a_second_optimizer_does_not_split_the_step():
    clock = FakeClock()
    tl = Timeline(clock)
    _train_step(tl, clock, opt_id=1)
    _train_step(tl, clock, opt_id=2)  # generator step of a GAN: same iteration
    _train_step(tl, clock, opt_id=1)
    assert len(tl.steps) == 2
    assert tl.steps[1].micro_batches == 2


def test_finish_closes_a_trailing_partial_step_only_if_it_did_work():
    clock = FakeClock()
    tl = Timeline(clock)
    _train_step(tl, clock)
    assert tl.finish() is None
    _phase(tl, clock, "forward", 2)
    tl.boundary("forward")
    last = tl.finish()
    assert last is not None and last.forward_ms == 2


class EventClock(Clock):
    """Marks are objects, like CUDA events: subtracting a wall-clock float from one fails."""

    kind = "events"

    def __init__(self, time_source: FakeClock) -> None:
        self.source = time_source
        self.resolved: list[object] = []

    def mark(self) -> tuple[str, float]:
        return ("event", self.source.now)

    def resolve(self, last: tuple[str, float]) -> None:
        self.resolved.append(last)

    def elapsed_ms(self, start: tuple[str, float], end: tuple[str, float]) -> float:
        assert isinstance(start, tuple) and isinstance(end, tuple), "a wall mark reached the event clock"
        return end[1] - start[1]


def test_switching_clock_inside_the_first_forward_keeps_every_millisecond():
    # The session learns the device at the model's first forward (it was moved to the GPU after
    # the profiler attached): the open step holds wall marks, the rest of the run event marks.
    wall = FakeClock()
    tl = Timeline(wall)
    wall.tick(4)  # set-up before the first step
    _phase(tl, wall, "data", 1)
    tl.begin("forward")
    wall.tick(1)
    events = EventClock(wall)
    tl.switch_clock(events)
    wall.tick(2)
    tl.note_forward(8)
    tl.end("forward")
    _phase(tl, wall, "backward", 5)
    tl.note_loss(2.5)
    _phase(tl, wall, "optimizer", 2)
    tl.boundary("optimizer", 1)
    _train_step(tl, wall)
    first, second = tl.steps
    assert tl.clock is events and events.resolved
    assert (first.data_ms, first.forward_ms, first.backward_ms, first.optimizer_ms) == (1, 3, 5, 2)
    assert first.total_ms == pytest.approx(15) and first.other_ms == pytest.approx(4)
    assert first.start_ms == pytest.approx(0)
    assert second.start_ms == pytest.approx(15)
    assert (second.data_ms, second.forward_ms, second.backward_ms, second.optimizer_ms) == (1, 3, 5, 2)


def test_switching_to_the_same_clock_kind_is_a_no_op():
    clock = FakeClock()
    tl = Timeline(clock)
    _phase(tl, clock, "data", 1)
    tl.switch_clock(FakeClock())
    assert tl.clock is clock


def test_a_backward_that_raises_inside_a_recomputed_forward_keeps_its_time_in_its_own_step():
    """hf GPT-2 with gradient checkpointing crossed a memory limit inside a block's recomputation: the recomputed
    forward's end never came, backward's phase stayed open when its step closed, and the next step was recorded
    with 41.7 ms of backward in a 0.5 ms total (scalpel memory's record broke the phases-sum invariant)."""
    clock = FakeClock()
    tl = Timeline(clock)
    _phase(tl, clock, "data", 1)
    tl.begin("forward")
    clock.tick(3)
    tl.note_forward(8)
    tl.end("forward")
    tl.boundary("forward")
    tl.begin("backward")
    clock.tick(10)
    tl.begin("forward")  # checkpoint recomputation: attributed to backward
    clock.tick(30)  # ... and it raises here: no end("forward")
    tl.end("backward")  # the backward wrapper's finally
    tl.boundary("backward")
    clock.tick(0.5)
    tl.finish()
    for step in tl.steps:
        phases = step.data_ms + step.forward_ms + step.backward_ms + step.optimizer_ms
        assert phases <= step.total_ms + 1e-9, step
    assert tl.steps[0].backward_ms == pytest.approx(40)


def test_after_a_caught_error_inside_backward_the_next_forward_is_a_forward():
    """The wrapper ends every phase opened inside it (end_to): a script that catches the error and goes on
    (a bare except retry) has its next forward timed as forward, not as recomputation inside backward."""
    clock = FakeClock()
    tl = Timeline(clock)
    depth = tl.depth
    tl.begin("backward")
    tl.begin("forward")  # recomputation that raised
    clock.tick(5)
    tl.end_to(depth)
    assert tl.depth == 0 and tl.in_phase is None
    tl.begin("forward")
    clock.tick(3)
    tl.end("forward")
    tl.boundary("forward")
    assert tl.steps[-1].forward_ms == pytest.approx(3) and tl.steps[-1].backward_ms == pytest.approx(5)


def test_a_second_optimizer_delimits_steps_only_once_adopted():
    """A k-fold script builds a new optimizer per fold: the session adopts it once the first one is freed;
    until then its steps stay inside the open step (a GAN's second optimizer)."""
    clock = FakeClock()
    tl = Timeline(clock)
    _train_step(tl, clock, opt_id=1)
    _train_step(tl, clock, opt_id=2)
    assert len(tl.steps) == 1 and tl.primary_optimizer == 1
    tl.adopt_primary(2)
    _train_step(tl, clock, opt_id=2)
    _train_step(tl, clock, opt_id=2)
    assert len(tl.steps) == 3 and tl.primary_optimizer == 2

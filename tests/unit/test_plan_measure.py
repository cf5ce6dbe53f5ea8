"""The profiled allocator peak: frees the profiler misses on collective worker threads are restored."""

from __future__ import annotations

from plan_measure import MemoryEvent, Span, allocator_peak

MAIN, WORKER = "1", "2"


def _alloc(ts: float, addr: int, n: int, tid: str = MAIN) -> MemoryEvent:
    return MemoryEvent(ts=ts, tid=tid, addr=addr, nbytes=n)


def _free(ts: float, addr: int, n: int, tid: str = MAIN) -> MemoryEvent:
    return MemoryEvent(ts=ts, tid=tid, addr=addr, nbytes=-n)


def test_a_block_whose_address_is_reused_without_a_free_is_freed_when_its_collective_completes():
    # a reduce-scatter clones its 100-byte input inside the c10d op; the worker thread drops the
    # clone after the collective (no free event); the address is handed out again later
    events = [
        _alloc(1, 0xA, 100),
        _alloc(4, 0xB, 50),
        _alloc(5, 0xA, 100),
        _free(6, 0xA, 100),
        _free(7, 0xB, 50),
    ]
    spans = [Span("c10d::_reduce_scatter_base_", MAIN, 0.5, 2), Span("gloo:all_reduce", WORKER, 1.5, 3)]
    r = allocator_peak(events, spans)
    assert r.counter_peak == 250  # the raw counter never subtracts the clone
    assert r.peak == 150
    assert r.repaired_bytes == 100
    assert r.peak_ts == 5


def test_collectives_pair_with_worker_spans_in_issue_order():
    # the block belongs to the second collective, whose worker span ends at 9: it is live at 8
    events = [_alloc(6, 0xA, 100), _alloc(8, 0xB, 10), _alloc(10, 0xC, 10)]
    spans = [
        Span("c10d::_allgather_base_", MAIN, 1, 2),
        Span("c10d::_reduce_scatter_base_", MAIN, 5.5, 7),
        Span("gloo:all_gather", WORKER, 1.5, 3),
        Span("gloo:all_reduce", WORKER, 6.5, 9),
        Span("aten::clone", MAIN, 5.8, 6.2),
    ]
    r = allocator_peak(events, spans)
    assert r.peak == 110  # at 8 (block still live); at 10 it is gone: 20
    assert r.repaired_bytes == 100
    assert r.unresolved_bytes == 20  # B and C: no collective after them, so not a missed free


def test_a_free_is_never_placed_after_the_address_is_reused():
    # the worker span ends at 20, but the address is handed out again at 3: the block was gone by then
    events = [_alloc(1, 0xA, 100), _alloc(3, 0xA, 100), _alloc(4, 0xB, 50)]
    spans = [Span("c10d::allreduce_", MAIN, 0.5, 2), Span("gloo:all_reduce", WORKER, 1, 20)]
    assert allocator_peak(events, spans).peak == 150


def test_without_collectives_the_reading_is_the_counter():
    # a single-process window: a block outliving the window is not a missed free
    events = [_alloc(1, 0xA, 100), _alloc(2, 0xB, 30), _free(3, 0xB, 30), _alloc(4, 0xC, 50)]
    r = allocator_peak(events, [Span("aten::empty", MAIN, 0, 5)])
    assert r.peak == r.counter_peak == 150
    assert r.repaired_bytes == 0 and r.unresolved_bytes == 150


def test_blocks_outliving_an_unclean_window_are_reported_not_freed():
    events = [_alloc(1, 0xA, 100), _alloc(4, 0xB, 50)]
    spans = [Span("c10d::_reduce_scatter_base_", MAIN, 0.5, 2), Span("gloo:all_reduce", WORKER, 1.5, 3)]
    assert allocator_peak(events, spans, window_end_is_clean=True).peak == 100
    r = allocator_peak(events, spans, window_end_is_clean=False)
    assert r.peak == 150 and r.unresolved_bytes == 150

"""One storage ledger for scalpel memory (real tensors) and scalpel plan (fake tensors), one category vocabulary."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torchscalpel.plan.tracker import SimulationTracker, Timeline
from torchscalpel.runtime.alloc_tracker import AllocationTracker
from torchscalpel.runtime.memory_categories import ALL_CATEGORIES, CATEGORIES
from torchscalpel.runtime.storage_ledger import StorageLedger


@contextlib.contextmanager
def _real() -> Iterator[tuple[AllocationTracker, Callable[..., object]]]:
    tr = AllocationTracker()
    tr.start()
    try:
        yield tr, tr.recategorize
    finally:
        tr.stop()


@contextlib.contextmanager
def _fake() -> Iterator[tuple[SimulationTracker, Callable[..., object]]]:
    tr = SimulationTracker()
    with FakeTensorMode(), tr:
        yield tr, tr.label


@pytest.mark.parametrize("tracking", [_real, _fake], ids=["real", "fake"])
def test_both_trackers_count_storages_once_and_file_them_in_one_vocabulary(tracking) -> None:
    with tracking() as (tr, file_under):
        assert isinstance(tr, StorageLedger)
        a = torch.empty(1000)  # 4000 bytes
        view = a.view(10, 100)
        view.add_(1)  # in place: no new storage
        b = a * 2  # a new storage
        assert tr.live_bytes() == 8000 and tr.live_bytes("temporaries") == 8000
        file_under(a, "parameters")  # the view is the same storage
        assert tr.live_bytes("parameters") == 4000 and tr.live_bytes("temporaries") == 4000
        del b
        assert tr.live_bytes() == 4000 and tr.live_bytes("temporaries") == 0
        del a, view
        assert tr.live_bytes() == 0 and sum(tr.by_category.values()) == 0


def test_memory_reports_its_five_categories_and_the_plan_all_of_them() -> None:
    # the memory report's record keys are unchanged; the plan keeps buffers and inputs apart as well
    assert CATEGORIES == ("parameters", "gradients", "optimizer_state", "activations", "temporaries")
    assert set(CATEGORIES) < set(ALL_CATEGORIES)
    assert tuple(AllocationTracker().by_category) == CATEGORIES
    assert tuple(SimulationTracker().by_category) == ALL_CATEGORIES
    tr = SimulationTracker()
    with FakeTensorMode(), tr:
        x = torch.empty(10)
        tr.label(x, "inputs")
        del x
    timeline = tr.timeline()
    assert isinstance(timeline, Timeline) and tuple(timeline.bytes) == ALL_CATEGORIES
    assert int(timeline.bytes["inputs"].max()) == 40 and int(timeline.total()[-1]) == 0


def test_a_size_learnt_later_moves_the_totals_with_it() -> None:
    tr = SimulationTracker()
    with FakeTensorMode(), tr:
        x = torch.empty(10)
        index = tr.track(x)
        assert index is not None
        tr.resize(tr.records[index], 400)
        assert tr.live_bytes() == 400 and tr.live_bytes("temporaries") == 400
        del x
    assert tr.live_bytes() == 0
    assert int(tr.timeline().total().max()) == 400

"""The collective log's per-call path: cached descriptions and call sites give the same entries as the
general path, and the ring's NUL-ended slots read back whatever was in them before (L0/L1)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from torchscalpel.runtime import collectives
from torchscalpel.runtime.collectives import (
    CollectiveRecorder,
    _wrap,
    describe_entry,
    quote_site,
    read_rank_log,
)


def _fake_all_reduce(tensor, op=None, group=None, async_op=False):
    return None


def _entries(tmp_path):
    return read_rank_log(tmp_path / "rank-0.log").entries


def test_a_short_entry_over_a_long_one_reads_back_clean(tmp_path):
    rec = CollectiveRecorder(tmp_path, rank=0, world=1, restart=0)
    rec.finish(
        rec.enter("all_gather", "default", [[7, 7]] * 20, ["float32"] * 20, "/u/" + "x" * 100 + ".py:1"), True
    )
    for i in range(collectives.SLOTS - 1):
        rec.finish(rec.enter("barrier", "default", [], [], f"/u/t.py:{i}"), True)
    rec.enter("barrier", "default", [], [], "/u/t.py:9")  # slot 0 again, much shorter than what it replaces
    newest = _entries(tmp_path)[-1]
    assert (newest["op"], newest["site"], newest["done"], newest["shapes"]) == ("barrier", "/u/t.py:9", 0, [])


def test_a_very_long_path_keeps_its_end_and_the_slot_stays_json(tmp_path):
    rec = CollectiveRecorder(tmp_path, rank=0, world=1, restart=0)
    site = "/" + "deep/" * 200 + "train.py:42"
    rec.enter("all_gather", "default", [[1000, 1000]] * 200, ["bfloat16"] * 200, site)
    entry = _entries(tmp_path)[0]
    assert entry["site"].startswith("...") and entry["site"].endswith("deep/train.py:42")
    assert entry["truncated"] and len(entry["shapes"]) == 4
    assert len(quote_site(site)) <= collectives.SITE_MAX + 8


def test_the_cached_path_logs_what_each_call_had(tmp_path):
    rec = CollectiveRecorder(tmp_path, rank=0, world=1, restart=0)
    wrapped = _wrap(rec, "all_reduce", _fake_all_reduce)
    a, b = torch.ones(2, 3), torch.ones(2, 3, dtype=torch.float64)
    first = sys._getframe().f_lineno + 2
    for t in (a, a, b, torch.ones(4)):
        wrapped(t)
    wrapped(tensor=a)
    entries = _entries(tmp_path)
    assert [(e["shapes"], e["dtypes"]) for e in entries] == [
        ([[2, 3]], ["float32"]),
        ([[2, 3]], ["float32"]),
        ([[2, 3]], ["float64"]),
        ([[4]], ["float32"]),
        ([[2, 3]], ["float32"]),
    ]
    assert [e["site"] for e in entries[:4]] == [f"{__file__}:{first}"] * 4
    assert entries[4]["site"] == f"{__file__}:{first + 1}"  # another line of the same code object
    assert [e["seq"] for e in entries] == [1, 2, 3, 4, 5] and all(e["done"] == 1 for e in entries)
    assert read_rank_log(tmp_path / "rank-0.log").completed == 5


def test_description_bytes_are_the_json_the_reader_expects():
    body = describe_entry("all_reduce", "group 3", [[2, 3]], ["float32"])
    assert json.loads(b"{" + body + b"}") == {
        "op": "all_reduce",
        "group": "group 3",
        "dtypes": ["float32"],
        "shapes": [[2, 3]],
    }


def test_threads_issuing_collectives_at_once_get_distinct_slots_and_numbers(tmp_path):
    import threading

    rec = CollectiveRecorder(tmp_path, rank=0, world=1, restart=0)
    wrapped = _wrap(rec, "all_reduce", _fake_all_reduce)
    t = torch.ones(2)

    def work():
        for _ in range(50):
            wrapped(t)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    entries = _entries(tmp_path)
    assert sorted(e["n"] for e in entries) == list(range(200)) and sorted(e["seq"] for e in entries) == list(
        range(1, 201)
    )
    assert read_rank_log(tmp_path / "rank-0.log").completed == 200


def test_a_collective_that_raises_is_marked_raised_and_the_error_reaches_the_caller(tmp_path):
    rec = CollectiveRecorder(tmp_path, rank=0, world=1, restart=0)

    def broken(tensor, op=None, group=None, async_op=False):
        raise RuntimeError("Connection closed by peer")

    wrapped = _wrap(rec, "all_reduce", broken)
    with pytest.raises(RuntimeError, match="closed by peer"):
        wrapped(torch.ones(3))
    wrapped_ok = _wrap(rec, "all_reduce", _fake_all_reduce)
    wrapped_ok(torch.ones(3))  # the depth guard was reset: the next call is logged
    entries = _entries(tmp_path)
    assert [e["done"] for e in entries] == [2, 1] and read_rank_log(tmp_path / "rank-0.log").completed == 1

"""The batcher merges concurrent requests, bounds its queue (503), times out (504), survives model errors."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from fixtures.serve_bundles import LinearRunner
from torchscalpel.serve.batcher import Batcher
from torchscalpel.serve.errors import RequestError


def rows(n: int, value: float = 1.0) -> list[np.ndarray]:
    return [np.full((n, 1, 8, 8), value, np.float32)]


def run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_share_a_batch_and_get_their_own_rows():
    runner = LinearRunner()

    async def main():
        b = Batcher(runner, max_batch=16, max_wait_s=0.2, max_queue=64, timeout_s=5)
        b.start()
        outs = await asyncio.gather(*(b.submit(rows(2, float(i))) for i in range(6)))
        await b.stop()
        return outs

    outs = run(main())
    assert runner.calls == [12]  # 6 requests x 2 rows in one call
    for i, (out,) in enumerate(outs):
        np.testing.assert_allclose(out, np.full((2, 64), float(i), np.float32) @ runner.weight, rtol=1e-5)


def test_max_batch_splits_calls():
    runner = LinearRunner()

    async def main():
        b = Batcher(runner, max_batch=4, max_wait_s=0.2, max_queue=64, timeout_s=5)
        b.start()
        await asyncio.gather(*(b.submit(rows(1)) for _ in range(10)))
        await b.stop()

    run(main())
    assert sum(runner.calls) == 10 and max(runner.calls) <= 4


def test_max_batch_one_never_merges():
    runner = LinearRunner()

    async def main():
        b = Batcher(runner, max_batch=1, max_wait_s=0.05, max_queue=64, timeout_s=5)
        b.start()
        await asyncio.gather(*(b.submit(rows(1)) for _ in range(5)))
        await b.stop()

    run(main())
    assert runner.calls == [1] * 5


def test_full_queue_answers_503_with_retry_after():
    gate = threading.Event()
    runner = LinearRunner(gate=gate)

    async def main():
        b = Batcher(runner, max_batch=1, max_wait_s=0, max_queue=2, timeout_s=5)
        b.start()
        first = asyncio.ensure_future(b.submit(rows(1)))
        await asyncio.sleep(0.05)  # the worker takes it and blocks on the gate
        waiting = [asyncio.ensure_future(b.submit(rows(1))) for _ in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(RequestError) as info:
            await b.submit(rows(1))
        gate.set()
        await asyncio.gather(first, *waiting)
        await b.stop()
        return info.value

    e = run(main())
    assert e.status == 503 and e.headers["Retry-After"] == "1"


def test_timeout_answers_504_and_the_item_is_skipped():
    gate = threading.Event()
    runner = LinearRunner(gate=gate)

    async def main():
        b = Batcher(runner, max_batch=1, max_wait_s=0, max_queue=8, timeout_s=0.1)
        b.start()
        first = asyncio.ensure_future(b.submit(rows(1)))
        await asyncio.sleep(0.02)
        with pytest.raises(RequestError) as info:
            await b.submit(rows(3))
        gate.set()
        with pytest.raises(RequestError):
            await first  # also past its timeout
        ok = await asyncio.wait_for(b.submit(rows(2)), 5)
        stats = b.stats
        await b.stop()
        return info.value, ok, stats

    e, ok, stats = run(main())
    assert e.status == 504
    assert 3 not in runner.calls  # the timed-out request never ran
    assert ok[0].shape == (2, 10)
    assert stats.dropped_timeouts == 2


def test_model_error_is_500_for_that_batch_and_the_worker_survives():
    calls = []

    def flaky(inputs):
        calls.append(inputs[0].shape[0])
        if len(calls) == 1:
            raise RuntimeError("boom")
        return [inputs[0].reshape(inputs[0].shape[0], -1)[:, :2]]

    async def main():
        b = Batcher(flaky, max_batch=4, max_wait_s=0, max_queue=8, timeout_s=5)
        b.start()
        with pytest.raises(RequestError) as info:
            await b.submit(rows(1))
        ok = await b.submit(rows(1))
        await b.stop()
        return info.value, ok

    e, ok = run(main())
    assert e.status == 500 and "boom" in e.reason
    assert ok[0].shape == (1, 2)


def test_no_wait_when_nothing_is_arriving_but_wait_when_something_is():
    runner = LinearRunner()
    arriving = {"n": 0}

    async def main():
        b = Batcher(
            runner, max_batch=8, max_wait_s=30, max_queue=8, timeout_s=60, arriving=lambda: arriving["n"]
        )
        b.start()
        # Nothing else on the way: answered at once despite a 30 s max wait.
        await asyncio.wait_for(b.submit(rows(1)), 5)
        # One more request on the way: the first waits for it, and both run as one batch.
        arriving["n"] = 1
        first = asyncio.ensure_future(b.submit(rows(1)))
        await asyncio.sleep(0.1)
        assert not first.done()
        arriving["n"] = 0
        second = asyncio.ensure_future(b.submit(rows(2)))
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        await b.stop()

    run(main())
    assert runner.calls == [1, 3]

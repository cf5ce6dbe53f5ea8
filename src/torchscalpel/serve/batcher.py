"""Dynamic batching: concurrent requests merged into one model call.

Requests wait in a bounded queue. One worker task takes the oldest request, waits at most
``max_wait_s`` (from that request's arrival) for more, then runs as many queued requests as fit in
``max_batch`` rows as one call, in a single worker thread so the event loop keeps accepting and
rejecting requests meanwhile. A full queue is refused at once (503, the client retries); a
request that waits longer than its timeout is answered 504 and dropped from the queue if it
has not run yet.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from torchscalpel.serve.errors import RequestError

RunFn = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


@dataclass(slots=True)
class _Item:
    inputs: list[np.ndarray]
    rows: int
    future: asyncio.Future[list[np.ndarray]]
    arrived: float = field(default_factory=time.monotonic)


@dataclass(kw_only=True, slots=True)
class BatchStats:
    """Counters the metrics endpoint reads."""

    batches: int = 0
    rows: int = 0
    requests: int = 0
    dropped_timeouts: int = 0
    inference_seconds: float = 0.0


class Batcher:
    """Queue + worker. Create inside a running event loop; call :meth:`start` then :meth:`submit`."""

    def __init__(
        self,
        run: RunFn,
        *,
        max_batch: int,
        max_wait_s: float,
        max_queue: int,
        timeout_s: float,
        on_batch: Callable[[int, float], None] | None = None,
        arriving: Callable[[], int] | None = None,
    ) -> None:
        if max_batch < 1 or max_queue < 1:
            raise ValueError("max_batch and max_queue must be at least 1")
        self.run = run
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.stats = BatchStats()
        self.on_batch = on_batch
        """Called with (rows, seconds) after each model call (the metrics histograms)."""
        self.arriving = arriving
        """Requests still being received/decoded; with none on the way, waiting cannot grow the batch."""
        self._queue: deque[_Item] = deque()
        self._wakeup = asyncio.Event()
        # One thread: the model call releases the GIL, and a single thread keeps calls in order.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scalpel-infer")
        self._task: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        """Requests waiting (not yet taken into a batch)."""
        return len(self._queue)

    @property
    def running(self) -> bool:
        """True while the worker task is alive."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the worker task on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._worker(), name="scalpel-batcher")

    async def stop(self) -> None:
        """Stop the worker; fail whatever is still queued with 503."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        while self._queue:
            item = self._queue.popleft()
            if not item.future.done():
                item.future.set_exception(RequestError(503, "server is shutting down", {"Retry-After": "1"}))
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Queue one request (``rows`` = its batch size) and wait for its outputs."""
        if len(self._queue) >= self.max_queue:
            raise RequestError(
                503, "server is busy (request queue full); retry shortly", {"Retry-After": "1"}
            )
        rows = int(inputs[0].shape[0])
        item = _Item(inputs, rows, asyncio.get_running_loop().create_future())
        self._queue.append(item)
        self.stats.requests += 1
        self._wakeup.set()
        try:
            return await asyncio.wait_for(item.future, self.timeout_s)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            self.stats.dropped_timeouts += 1
            # wait_for cancelled the future; the worker skips cancelled items still in the queue.
            raise RequestError(
                504, f"no answer within {self.timeout_s:g} s; the server is overloaded"
            ) from None

    def poke(self) -> None:
        """Wake the worker (an arriving request was refused, so it may stop waiting for it)."""
        self._wakeup.set()

    def _take(self) -> list[_Item]:
        """The oldest request and the queued ones that fit beside it: same shape past the batch dimension
        (a model with a dynamic sequence length cannot concatenate two lengths), at most ``max_batch`` rows.
        Requests of another shape keep their place for the next call."""
        batch: list[_Item] = []
        rows = 0
        kept: list[_Item] = []
        key: list[tuple[int, ...]] | None = None
        while self._queue:
            item = self._queue[0]
            if item.future.done():  # timed out or cancelled while waiting
                self._queue.popleft()
                continue
            if batch and rows + item.rows > self.max_batch:
                break
            shapes = [a.shape[1:] for a in item.inputs]
            self._queue.popleft()
            if key is not None and shapes != key:
                kept.append(item)
                continue
            key = shapes
            batch.append(item)
            rows += item.rows
        self._queue.extendleft(reversed(kept))
        return batch

    def _queued_rows(self) -> int:
        return sum(i.rows for i in self._queue if not i.future.done())

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            deadline = self._queue[0].arrived + self.max_wait_s
            # Wait for company only while someone is on the way: a lone client pays no batching delay,
            # and under load the queue fills while the previous batch runs anyway.
            while (
                self._queued_rows() < self.max_batch
                and (self.arriving is None or self.arriving() > 0)
                and (left := deadline - time.monotonic()) > 0
            ):
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), left)
                except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
                    break
            batch = self._take()
            if not batch:
                continue
            merged = [
                np.concatenate([it.inputs[i] for it in batch]) if len(batch) > 1 else batch[0].inputs[i]
                for i in range(len(batch[0].inputs))
            ]
            t0 = time.perf_counter()
            try:
                outputs = await loop.run_in_executor(self._executor, self.run, merged)
            except Exception as exc:  # the model failed on a validated batch: a server error for each request
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(
                            RequestError(500, f"inference failed: {str(exc).splitlines()[0][:200]}")
                        )
                continue
            elapsed = time.perf_counter() - t0
            rows = sum(it.rows for it in batch)
            self.stats.batches += 1
            self.stats.rows += rows
            self.stats.inference_seconds += elapsed
            if self.on_batch is not None:
                self.on_batch(rows, elapsed)
            start = 0
            for it in batch:
                if not it.future.done():
                    it.future.set_result([o[start : start + it.rows] for o in outputs])
                start += it.rows

"""Large JSON bodies decode off the event loop: /healthz stays responsive while clients loop 5 MB bodies."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np

from fixtures.live_server import live_server
from fixtures.serve_bundles import LinearRunner, linear_bundle
from torchscalpel.serve.app import ByteBudget, ServeConfig, create_app


def _post(port: int, body: bytes) -> int:
    head = (f"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
        c.sendall(head + body)
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    return int(data[9:12])


def _healthz_seconds(port: int) -> float:
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while c.recv(4096):
            pass
    return time.perf_counter() - t0


def test_healthz_answers_while_large_bodies_decode(tmp_path):
    rows = 4000  # ~5.4 MB of JSON floats, a valid request for a bundle checked at batch 4096
    x = np.random.default_rng(0).standard_normal((rows, 1, 8, 8)).astype(np.float32)
    big = json.dumps({"inputs": x.tolist()}).encode()
    assert len(big) > 5_000_000
    app = create_app(linear_bundle(tmp_path, max_batch=4096), LinearRunner(),
                     ServeConfig(max_batch=4096, max_wait_ms=1, max_body=16 << 20, timeout_s=60, body_timeout_s=60))
    stop = time.monotonic() + 4.0
    statuses: list[int] = []

    def loop_big(port: int) -> None:
        while time.monotonic() < stop:
            statuses.append(_post(port, big))

    with live_server(app) as (_, port):
        workers = [threading.Thread(target=loop_big, args=(port,), daemon=True) for _ in range(3)]
        for w in workers:
            w.start()
        time.sleep(0.5)
        waits = []
        while time.monotonic() < stop:
            waits.append(_healthz_seconds(port))
            time.sleep(0.05)
        for w in workers:
            w.join(60)
    assert statuses and set(statuses) == {200}, statuses
    waits.sort()
    # Before: each 5 MB body was parsed on the event loop (~0.3 s of CPU each, three clients), so
    # /healthz waited behind them. Now it waits for at most one C-level parse step holding the GIL.
    print("healthz waits (s):", [round(w, 3) for w in waits])
    assert waits[len(waits) // 2] < 0.13 and waits[int(len(waits) * 0.9)] < 0.4, [round(w, 3) for w in waits]


def test_byte_budget_bounds_bytes_held_at_once():
    import asyncio

    async def main() -> int:
        budget = ByteBudget(100)
        peak = 0

        async def one(n: int) -> None:
            nonlocal peak
            async with budget.hold(n):
                peak = max(peak, budget.held)
                await asyncio.sleep(0.01)

        await asyncio.gather(*(one(60) for _ in range(5)), one(500))
        assert budget.held == 0
        return peak

    assert asyncio.run(main()) <= 100

"""Large JSON bodies decode off the event loop (in the bounded decode pool), so /healthz keeps answering."""

from __future__ import annotations

import json
import socket
import threading

import numpy as np

from fixtures.live_server import live_server
from fixtures.serve_bundles import LinearRunner, linear_bundle
from torchscalpel.serve.app import ByteBudget, ServeConfig, create_app


def _post(port: int, body: bytes) -> int:
    head = (
        f"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
        c.sendall(head + body)
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    return int(data[9:12])


def _healthz_status(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := c.recv(4096):
            data += chunk
    return int(data[9:12])


def test_large_bodies_decode_off_the_event_loop_and_healthz_answers(tmp_path, monkeypatch):
    """Judged by where decoding ran, not by how long /healthz took (which depends on machine load)."""
    import torchscalpel.serve.app as app_mod

    threads: dict[str, set[int]] = {"decode": set(), "loop": set()}
    real_decode = app_mod.decode

    def recording_decode(body, *args, **kwargs):
        if len(body) > app_mod.INLINE_DECODE_BYTES:
            threads["decode"].add(threading.get_ident())
        return real_decode(body, *args, **kwargs)

    monkeypatch.setattr(app_mod, "decode", recording_decode)
    rows = 4000  # ~5.4 MB of JSON floats, a valid request for a bundle checked at batch 4096
    x = np.random.default_rng(0).standard_normal((rows, 1, 8, 8)).astype(np.float32)
    big = json.dumps({"inputs": x.tolist()}).encode()
    assert len(big) > 5_000_000
    app = create_app(
        linear_bundle(tmp_path, max_batch=4096),
        LinearRunner(),
        ServeConfig(max_batch=4096, max_wait_ms=1, max_body=16 << 20, timeout_s=60, body_timeout_s=60),
    )

    @app.get("/_loop_thread")
    async def loop_thread() -> dict[str, int]:  # runs on the event loop's thread
        threads["loop"].add(threading.get_ident())
        return {}

    statuses: list[int] = []
    with live_server(app) as (_, port):
        workers = [
            threading.Thread(target=lambda: statuses.extend(_post(port, big) for _ in range(2)), daemon=True)
            for _ in range(2)
        ]
        for w in workers:
            w.start()
        health = [_healthz_status(port) for _ in range(3)]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            c.sendall(b"GET /_loop_thread HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            while c.recv(4096):
                pass
        for w in workers:
            w.join(120)
    assert statuses == [200] * 4 and health == [200] * 3, (statuses, health)
    assert threads["loop"] and threads["decode"], threads
    assert not threads["decode"] & threads["loop"], "a large body was decoded on the event loop"


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

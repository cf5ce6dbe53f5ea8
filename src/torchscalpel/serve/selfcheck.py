"""A local serve check: start the server on 127.0.0.1 in this process, send real requests, compare.

Used by ``scalpel demo`` (through :mod:`torchscalpel.stages.export_demo`): proves that a bundle served over
HTTP, with concurrent requests merged into batches, answers what the eager model answers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from torchscalpel.errors import ScalpelError


@contextlib.contextmanager
def loopback_server(app: Any) -> Iterator[int]:
    """Serve ``app`` on 127.0.0.1 (a free port) in a background thread; yield the port."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise ScalpelError("The local serve check could not start its server.")
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


def _post(port: int, body: bytes) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/predict", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def serve_check(
    bundle_path: Path,
    inputs: np.ndarray,
    expected: np.ndarray,
    *,
    rows_per_request: int = 2,
    concurrency: int = 8,
    atol: float = 1e-4,
    rtol: float = 1e-3,
) -> dict[str, Any]:
    """Serve the bundle (onnxruntime), post ``inputs`` in small concurrent requests, compare with ``expected``."""
    from torchscalpel.serve.app import ServeConfig, create_app
    from torchscalpel.serve.backends import load_runner
    from torchscalpel.ship.bundle import verify_bundle

    bundle = verify_bundle(bundle_path)
    app = create_app(bundle, load_runner(bundle, "onnxruntime"), ServeConfig(max_wait_ms=5))
    chunks = [(i, inputs[i : i + rows_per_request]) for i in range(0, len(inputs), rows_per_request)]
    got = np.zeros_like(expected)
    statuses: list[int] = []
    with loopback_server(app) as port:
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            futures = {
                pool.submit(_post, port, json.dumps({"inputs": c.tolist()}).encode()): i for i, c in chunks
            }
            for fut in concurrent.futures.as_completed(futures):
                status, payload = fut.result()
                statuses.append(status)
                if status == 200:
                    out = np.asarray(next(iter(payload["outputs"].values())), dtype=expected.dtype)
                    got[futures[fut] : futures[fut] + len(out)] = out
        metrics = app.state.metrics
    ok = all(s == 200 for s in statuses)
    max_abs = float(np.max(np.abs(got - expected))) if ok else float("inf")
    return {
        "requests": len(statuses),
        "all_200": ok,
        "max_abs_error": max_abs,
        "matches_eager": ok and bool(np.allclose(got, expected, atol=atol, rtol=rtol)),
        "same_argmax": ok and expected.ndim == 2 and bool((got.argmax(1) == expected.argmax(1)).all()),
        "batches": metrics.batch_size.n,
    }

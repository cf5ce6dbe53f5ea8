"""The listening socket and connection handling of `scalpel serve` (loopback, bounded)."""

from __future__ import annotations

import socket
import statistics
import time

from fixtures.live_server import live_server
from fixtures.serve_bundles import LinearRunner, linear_bundle
from torchscalpel.serve.app import ServeConfig, create_app
from torchscalpel.serve.server import listen_socket


def _app(tmp_path, **config):
    return create_app(linear_bundle(tmp_path), LinearRunner(), ServeConfig(max_wait_ms=1, **config))


def _keepalive_latencies(port: int, n: int) -> list[float]:
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while not data.endswith(b'{"status":"ok"}'):
                chunk = c.recv(4096)
                assert chunk, "server closed the connection"
                data += chunk
            out.append(time.perf_counter() - t0)
    return out


def test_listen_socket_is_tcp_so_asyncio_sets_nodelay():
    sock = listen_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        sock.listen(1)
        with socket.create_connection(sock.getsockname(), timeout=5):
            conn, _ = sock.accept()
            assert conn.proto == socket.IPPROTO_TCP  # what asyncio's _set_nodelay checks
            conn.close()
    finally:
        sock.close()


def test_keepalive_requests_do_not_wait_for_delayed_acks(tmp_path):
    """Nagle + delayed ACK cost ~40 ms per keep-alive response before the fix; loopback answers in ~1 ms."""
    with live_server(_app(tmp_path)) as (_, port):
        lat = _keepalive_latencies(port, 30)
    assert statistics.median(lat[5:]) < 0.02, [round(x * 1e3, 1) for x in lat]

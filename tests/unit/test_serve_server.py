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


def _guarded(tmp_path, **limits):
    from torchscalpel.serve.server import uvicorn_settings

    config = ServeConfig(max_wait_ms=1, **limits)
    app = create_app(linear_bundle(tmp_path), LinearRunner(), config)
    return app, uvicorn_settings(app, config)


def _healthz_seconds(port: int) -> float:
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := c.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:100]
    return time.perf_counter() - t0


def _closed_by_server(c: socket.socket, wait_s: float) -> bool:
    c.settimeout(wait_s)
    try:
        return c.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _refused_count(app, reason: str) -> int:
    return app.state.metrics.refused[reason]


def test_idle_connections_from_one_address_cannot_starve_healthz(tmp_path):
    """767 idle sockets made the old server answer a bare 503 to everyone, and none was ever closed."""
    app, settings = _guarded(tmp_path, header_timeout_s=1.0, max_connections_per_client=20, max_connections=64)
    with live_server(app, **settings) as (_, port):
        idle = []
        try:
            for _ in range(80):  # from another loopback address: the cap is per client address
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.connect(("127.0.0.1", port))
                idle.append(s)
            t_healthz = max(_healthz_seconds(port) for _ in range(5))
            assert t_healthz < 1.0
            time.sleep(0.2)
            assert _refused_count(app, "per_client_limit") == 60
            # The 20 admitted idle sockets are closed by the header timeout, not kept forever.
            deadline = time.monotonic() + 5
            still_open = list(idle)
            while still_open and time.monotonic() < deadline:
                still_open = [s for s in still_open if not _closed_by_server(s, 0.05)]
            assert not still_open, f"{len(still_open)} idle connections were never closed"
            assert _refused_count(app, "header_timeout") == 20
            assert _healthz_seconds(port) < 1.0
        finally:
            for s in idle:
                s.close()


def test_slow_headers_and_idle_keepalive_are_closed(tmp_path):
    app, settings = _guarded(tmp_path, header_timeout_s=1.0, keepalive_s=1.0)
    with live_server(app, **settings) as (_, port):
        # Slowloris: one header byte every 0.2 s never completes a request head.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            start = time.monotonic()
            closed = False
            for byte in (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200):
                try:
                    c.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                if _closed_by_server(c, 0.2):
                    closed = True
                    break
                if time.monotonic() - start > 6:
                    break
            assert closed and time.monotonic() - start < 3
        assert _refused_count(app, "header_timeout") == 1
        # Keep-alive: after one answered request an idle connection is closed after keepalive_s.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while not data.endswith(b'{"status":"ok"}'):
                data += c.recv(4096)
            t0 = time.monotonic()
            assert _closed_by_server(c, 4.0)
            assert time.monotonic() - t0 < 3


def test_connection_limit_flags_are_validated():
    import pytest

    for bad in ({"header_timeout_s": float("nan")}, {"keepalive_s": 0}, {"max_connections_per_client": 0},
                {"max_connections_per_client": 10, "max_connections": 5}):
        with pytest.raises(ValueError):
            ServeConfig(**bad)

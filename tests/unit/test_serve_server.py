"""The listening socket and connection handling of `scalpel serve` (loopback, bounded)."""

from __future__ import annotations

import socket
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


def test_connections_accepted_by_asyncio_on_it_get_tcp_nodelay():
    """Nagle + delayed ACK cost ~40 ms per keep-alive response before the fix. Judged by the option on
    the accepted socket (what asyncio sets for a TCP socket), not by latency, which depends on load."""
    import asyncio

    async def main() -> int:
        got: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            got.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        sock = listen_socket("127.0.0.1", 0)
        server = await asyncio.start_server(on_client, sock=sock)
        async with server:
            _reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            value = await asyncio.wait_for(got, 10)
            writer.close()
        return value

    assert asyncio.run(main()) != 0


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
    app, settings = _guarded(
        tmp_path, header_timeout_s=1.0, max_connections_per_client=20, max_connections=64
    )
    with live_server(app, **settings) as (_, port):
        idle = []
        try:
            for _ in range(80):  # from another loopback address: the cap is per client address
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.connect(("127.0.0.1", port))
                idle.append(s)
            for _ in range(5):
                _healthz_seconds(port)  # answered 200 while 80 idle sockets are open
            time.sleep(0.2)
            # each socket over the cap closed the address's oldest idle one (issue 30 item 3)
            assert _refused_count(app, "per_client_evicted_idle") == 60
            assert _refused_count(app, "per_client_limit") == 0
            # The 20 still open are closed by the header timeout, not kept forever.
            deadline = time.monotonic() + 5
            still_open = list(idle)
            while still_open and time.monotonic() < deadline:
                still_open = [s for s in still_open if not _closed_by_server(s, 0.05)]
            assert not still_open, f"{len(still_open)} idle connections were never closed"
            assert _refused_count(app, "header_timeout") == 20
            _healthz_seconds(port)
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
            for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
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
            assert closed  # within the 6 s window; trickling every byte would take over 40 s
        assert _refused_count(app, "header_timeout") == 1
        # Keep-alive: after one answered request an idle connection is closed after keepalive_s.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while not data.endswith(b'{"status":"ok"}'):
                data += c.recv(4096)
            assert _closed_by_server(c, 4.0)  # keepalive_s is 1 s


def test_connection_limit_flags_are_validated():
    import pytest

    for bad in (
        {"header_timeout_s": float("nan")},
        {"keepalive_s": 0},
        {"max_connections_per_client": 0},
        {"max_connections_per_client": 10, "max_connections": 5},
    ):
        with pytest.raises(ValueError):
            ServeConfig(**bad)

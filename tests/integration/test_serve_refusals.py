"""Refused requests close their connection and read no more of their body (issue 41, item 4).

A real uvicorn server on 127.0.0.1 (a free port, scalpel's own connection-guarding protocol) serving a
NumPy runner; the clients are raw sockets, so what is judged is what goes over the wire: the answer, its
``Connection: close``, and the server closing the socket while the client is still sending.
"""

from __future__ import annotations

import json
import select
import socket
import time

import pytest

from fixtures.live_server import live_server
from fixtures.serve_bundles import LinearRunner, linear_bundle, linear_manifest
from helpers import run_cli
from torchscalpel.serve.app import ServeConfig, create_app
from torchscalpel.serve.server import uvicorn_settings

HANG_S = 60.0
"""Generous bound on any one exchange: only a hang reaches it."""
FLOOD_BYTES = 64 << 20
"""What a client sends before the test calls the body read to its end (the cap is 85 KiB)."""
VALID = json.dumps({"inputs": [[[[0.5] * 8] * 8]]}).encode()


@pytest.fixture()
def served(tmp_path):
    """(port, app) of a server with scalpel's protocol and limits; a 1 s body timeout, a token when asked."""

    def start(**config):
        cfg = ServeConfig(max_wait_ms=1, body_timeout_s=1.0, **config)
        app = create_app(linear_bundle(tmp_path), LinearRunner(), cfg)
        return app, live_server(app, **uvicorn_settings(app, cfg))

    return start


def _drain(c: socket.socket) -> bytes:
    """What is left to read before the server's FIN or reset."""
    c.settimeout(5)
    data = b""
    try:
        while chunk := c.recv(65536):
            data += chunk
    except OSError:
        pass
    return data


def _flood(port: int, head: bytes, piece: bytes) -> tuple[bytes, bool, int]:
    """Send ``head``, then ``piece`` again and again, reading what the server answers meanwhile.

    Stops when the server closes the connection (a FIN, a reset, or a send that fails) or after
    ``FLOOD_BYTES``. Returns (what the server sent, whether it closed the connection, body bytes sent).
    """
    reply, sent, closed = b"", 0, False
    deadline = time.monotonic() + HANG_S
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(head)
        c.setblocking(False)
        view = memoryview(piece)
        while sent < FLOOD_BYTES and time.monotonic() < deadline:
            readable, writable, _ = select.select([c], [c], [], 1.0)
            if readable:
                try:
                    data = c.recv(65536)
                except ConnectionResetError:
                    closed = True
                    break
                if not data:
                    closed = True
                    break
                reply += data
            if writable:
                try:
                    n = c.send(view)
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                sent += n
                view = view[n:] or memoryview(piece)
        if closed:
            reply += _drain(c)  # the answer arrived before the close, even when a reset followed it
    return reply, closed, sent


def _head(reply: bytes) -> str:
    return reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()


POST = b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def test_413_on_an_over_cap_content_length_closes_before_the_declared_body(served):
    """Before: 413, then the connection stayed open and h11 received and parsed the body to its declared end."""
    app, server = served()
    declared = 1 << 30
    with server as (_, port):
        reply, closed, sent = _flood(port, POST + b"Content-Length: %d\r\n\r\n" % declared, b"1," * 32768)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert "connection: close" in _head(reply)
    assert closed, f"the server was still reading after {sent} of the {declared} declared bytes"
    assert app.state.metrics.refused["answered_before_body_end"] == 1


def test_413_on_a_chunked_body_closes_while_the_client_still_sends(served):
    """Before: a chunked body went on being received and parsed for as long as the client sent (5.2 GB in 10 s)."""
    chunk = b"1," * 32768
    app, server = served()
    with server as (_, port):
        reply, closed, sent = _flood(
            port, POST + b"Transfer-Encoding: chunked\r\n\r\n", b"%x\r\n%s\r\n" % (len(chunk), chunk)
        )
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert "connection: close" in _head(reply)
    assert closed, f"the server was still reading the chunked body after {sent} bytes"
    assert app.state.metrics.refused["answered_before_body_end"] == 1


def test_401_before_the_body_closes_too(served):
    """Any answer sent before the body's end closes: without a token the body is not worth receiving."""
    _, server = served(token="t" * 24)
    with server as (_, port):
        reply, closed, _ = _flood(port, POST + b"Content-Length: %d\r\n\r\n" % (1 << 30), b"1," * 32768)
    assert reply.startswith(b"HTTP/1.1 401") and "connection: close" in _head(reply), reply[:200]
    assert closed


def test_408_on_a_stalled_body_closes(served):
    _, server = served()
    with server as (_, port), socket.create_connection(("127.0.0.1", port), timeout=HANG_S) as c:
        c.sendall(POST + b"Content-Length: 1000\r\n\r\n" + b'{"inputs": ')
        reply = _drain_until_closed(c)
    assert reply.startswith(b"HTTP/1.1 408") and "connection: close" in _head(reply), reply[:200]
    assert reply.endswith(b"<closed>"), "the connection was kept open after the 408"


def _drain_until_closed(c: socket.socket) -> bytes:
    """Read until the server closes (marked ``<closed>``) or ``HANG_S`` passes."""
    c.settimeout(HANG_S)
    data = b""
    try:
        while chunk := c.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        return data
    return data + b"<closed>"


def test_missing_content_type_is_415_before_the_body_is_read(served):
    """Before: a POST with no Content-Type was read as JSON and served 200 (docs/serve.md lists 415)."""
    _, server = served()
    with server as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=HANG_S) as c:
            c.sendall(
                b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(VALID) + VALID
            )
            reply = _drain_until_closed(c)
        assert reply.startswith(b"HTTP/1.1 415"), reply[:200]
        assert "no content-type" in reply.split(b"\r\n\r\n", 1)[1].decode().lower()
        # an over-cap body with no Content-Type is refused from its head: 415, closed, the body unread
        reply, closed, _ = _flood(
            port,
            b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (1 << 30),
            b"1," * 32768,
        )
    assert reply.startswith(b"HTTP/1.1 415") and "connection: close" in _head(reply), reply[:200]
    assert closed


def test_a_request_whose_body_was_read_keeps_its_connection(served):
    """The close is for refusals before the body's end: answered requests keep keep-alive."""
    _, server = served()
    with server as (_, port), socket.create_connection(("127.0.0.1", port), timeout=HANG_S) as c:
        for want in (b"HTTP/1.1 200", b"HTTP/1.1 422", b"HTTP/1.1 200"):
            body = VALID if want.endswith(b"200") else b'{"inputs": [[1, 2]]}'
            c.sendall(POST + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = c.recv(65536)
                assert chunk, "the server closed a connection whose request it had read whole"
                head += chunk
            assert head.startswith(want), head[:200]
            length = int(
                next(
                    v
                    for k, v in (ln.split(": ", 1) for ln in _head(head).split("\r\n")[1:])
                    if k == "content-length"
                )
            )
            rest = head.split(b"\r\n\r\n", 1)[1]
            while len(rest) < length:
                rest += c.recv(65536)
            assert "connection: close" not in _head(head)


def test_a_half_closed_client_gets_its_answer(served):
    """Before: shutdown(SHUT_WR) after a whole request made asyncio close the transport, and the answer was lost."""
    _, server = served()
    with server as (_, port), socket.create_connection(("127.0.0.1", port), timeout=HANG_S) as c:
        c.sendall(POST + b"Content-Length: %d\r\n\r\n" % len(VALID) + VALID)
        c.shutdown(socket.SHUT_WR)
        reply = _drain_until_closed(c)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    body = reply.removesuffix(b"<closed>").split(b"\r\n\r\n", 1)[1]
    assert json.loads(body)["batch_size"] == 1
    assert reply.endswith(b"<closed>"), "the server kept a half-closed connection open after answering"


def test_an_unreadable_sign_key_exits_2_in_one_sentence(tmp_path):
    """Before: exit 1 (export refuses the same key with exit 2)."""
    from torchscalpel.ship.bundle import write_manifest

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    write_manifest(bundle, linear_manifest())
    key = tmp_path / "nosuch.key"
    r = run_cli("serve", str(bundle), "--sign-key", str(key), "--port", "0")
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert err.startswith("scalpel: error: ") and "\n" not in err and "Traceback" not in err, err
    assert f"Cannot read the signing key {key}" in err

"""Issue 30 items 1, 3 and 11: the body cap comes from the manifest, rows are counted before np.asarray,
idle sockets cannot lock an address out, and ``/v1/predict/`` is no redirect (in-process, loopback, bounded)."""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from fixtures.live_server import live_server
from fixtures.serve_bundles import LinearRunner, linear_bundle
from torchscalpel.serve import codec
from torchscalpel.serve.app import ServeConfig, create_app
from torchscalpel.serve.errors import RequestError
from torchscalpel.serve.server import uvicorn_settings


def _app(tmp_path, **config):
    return create_app(linear_bundle(tmp_path), LinearRunner(), ServeConfig(max_wait_ms=1, **config))


def test_the_default_body_cap_is_what_the_largest_valid_request_needs(tmp_path):
    """Before: 10 MiB for every bundle, so 10 MB bodies were parsed (0.85 s of GIL each) and then refused."""
    app = _app(tmp_path, max_batch=8)
    cap = app.state.max_body
    specs = [codec.InputSpec.from_manifest(e) for e in linear_bundle(tmp_path).inputs]
    assert cap == codec.body_cap(specs, 8) < 200_000
    # the widest valid request: 8 rows of the longest float text, pretty-printed
    x = np.full((8, 1, 8, 8), -2.2250738585072014e-308)
    widest = json.dumps({"inputs": x.tolist()}, indent=2).encode()
    assert len(widest) < cap
    with TestClient(app) as c:
        r = c.post("/v1/predict", content=widest, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        abusive = b'{"inputs": [' + b"[[[0.5]]]," * (1_000_000) + b"[[[0.5]]]]}"  # 10 MB
        r = c.post("/v1/predict", content=abusive, headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
    # an explicit --max-body still wins; a dynamic inner dimension falls back to 10 MiB
    assert _app(tmp_path, max_body=1234).state.max_body == 1234
    spec = codec.InputSpec("x", np.dtype("float32"), (None, None))
    assert codec.body_cap([spec], 8) is None


def test_rows_are_counted_before_the_array_is_built(monkeypatch):
    built = []
    real = np.asarray
    monkeypatch.setattr(codec.np, "asarray", lambda *a, **k: built.append(1) or real(*a, **k))
    spec = codec.InputSpec("x", np.dtype("float32"), (None, 1, 8, 8))
    rows = [[[[0.0] * 8] * 8]] * 100_000
    with pytest.raises(RequestError, match="has a batch of 100000; the most one request may send is 32"):
        codec.decode_json(json.dumps({"inputs": rows}).encode(), [spec], 32)
    with pytest.raises(RequestError, match="has a row of 3 values in dimension 1; expected 1"):
        codec.decode_json(json.dumps({"inputs": [[[[0.0] * 8] * 8] * 3] * 4}).encode(), [spec], 32)
    assert built == []
    codec.decode_json(json.dumps({"inputs": rows[:2]}).encode(), [spec], 32)
    assert built == [1]


def test_a_trailing_slash_is_not_redirected_to_the_clients_host(tmp_path):
    with TestClient(_app(tmp_path), base_url="http://127.0.0.1") as c:
        r = c.post(
            "/v1/predict/",
            content=b'{"inputs": [[[[0]]]]}',
            headers={"host": "evil.example", "content-type": "application/json"},
            follow_redirects=False,
        )
    assert r.status_code == 404 and "location" not in r.headers, (r.status_code, r.headers)


def _request(c: socket.socket) -> bytes:
    c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while not data.endswith(b'{"status":"ok"}'):
        chunk = c.recv(4096)
        assert chunk, "closed by the server"
        data += chunk
    return data


def _from(address: str, port: int) -> socket.socket:
    s = socket.socket()
    s.bind((address, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    return s


def test_idle_sockets_cannot_lock_their_address_out(tmp_path):
    """Before: 20 idle sockets from an address reset every further connection from it until they timed out."""
    app = _app(tmp_path, header_timeout_s=30.0, max_connections_per_client=20, max_connections=64)
    with live_server(
        app,
        **uvicorn_settings(
            app,
            ServeConfig(
                max_wait_ms=1, header_timeout_s=30.0, max_connections_per_client=20, max_connections=64
            ),
        ),
    ) as (_, port):
        idle = [_from("127.0.0.3", port) for _ in range(20)]
        busy: list[socket.socket] = []
        try:
            time.sleep(0.2)
            with _from("127.0.0.3", port) as c:
                assert _request(c).startswith(b"HTTP/1.1 200")
            assert app.state.metrics.refused["per_client_evicted_idle"] == 1
            assert idle[0].recv(1) == b""  # the oldest idle socket was the one closed
            # 20 connections that each sent a request are not idle: the 21st is the one refused
            busy = [_from("127.0.0.4", port) for _ in range(20)]
            for c in busy:
                _request(c)
            extra = _from("127.0.0.4", port)
            try:
                assert extra.recv(1) == b""
            except ConnectionResetError:
                pass
            extra.close()
            assert app.state.metrics.refused["per_client_limit"] == 1
            for c in busy:
                assert _request(c).startswith(b"HTTP/1.1 200")
        finally:
            for s in idle + busy:
                s.close()

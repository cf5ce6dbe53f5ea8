"""Protocol-level bad input: each answers a 4xx (or closes quietly) with no traceback, and /metrics counts it."""

from __future__ import annotations

import json
import logging
import socket
import struct
import time

import pytest
from fastapi.testclient import TestClient

from fixtures.live_server import live_server
from fixtures.serve_bundles import LinearRunner, linear_bundle
from torchscalpel.serve.app import ServeConfig, create_app


@pytest.fixture()
def app(tmp_path):
    return create_app(linear_bundle(tmp_path), LinearRunner(), ServeConfig(max_wait_ms=1, body_timeout_s=5))


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture()
def server_log():
    """Everything uvicorn logs (it does not propagate to the root logger, so caplog misses it)."""
    handler = _Collect()
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "uvicorn.asgi")]
    for lg in loggers:
        lg.addHandler(handler)
    yield handler
    for lg in loggers:
        lg.removeHandler(handler)


def _recv_all(sock: socket.socket, deadline_s: float = 5.0) -> bytes:
    """Read until the server closes (or the deadline passes); returns what arrived."""
    sock.settimeout(0.2)
    data = b""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return data + b"<closed>"
        data += chunk
    return data


def _metric(port: int, line_start: str) -> float | None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = _recv_all(c).decode()
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_lone_surrogate_in_an_input_name_is_422_not_500(app):
    with TestClient(app, raise_server_exceptions=False) as c:
        for body in (
            b'{"inputs": {"\\ud800": [[1]]}}',
            b'{"inputs": {"x": [[1]], "\\udfff\\ud800": 1}}',
            b'{"\\ud800": 1}',
        ):
            r = c.post("/v1/predict", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422, (body, r.status_code, r.text)
            assert "error" in json.loads(r.content)
        assert 'code="422"} 3' in c.get("/metrics").text


def _npy_header(h: bytes) -> bytes:
    h = h + b" " * (64 - ((10 + len(h) + 1) % 64)) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h


def test_bad_npy_header_error_has_no_memory_address(app):
    with TestClient(app) as c:
        body = _npy_header(b"{'descr': '<f4', 'fortran_order': False, 'shape': (1,4,)+(1,)}") + b"\0" * 16
        r = c.post("/v1/predict", content=body, headers={"content-type": "application/x-npy"})
        assert r.status_code == 422
        assert "0x" not in r.json()["error"] and " at " not in r.json()["error"], r.json()


def test_client_hanging_up_mid_body_is_counted_without_a_traceback(app, server_log):
    with live_server(app) as (_, port):
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(
                    b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 5000\r\n\r\n" + b'{"inputs": [[' + b"1," * 50
                )
                time.sleep(0.1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if _metric(port, 'scalpel_refused_total{reason="client_closed_mid_body"}') == 3:
                break
            time.sleep(0.05)
        assert _metric(port, 'scalpel_refused_total{reason="client_closed_mid_body"}') == 3
    tracebacks = [r.getMessage() for r in server_log.records if r.exc_info or r.levelno >= logging.ERROR]
    assert tracebacks == []


def test_content_length_with_chunked_answers_400_and_closes(app):
    with live_server(app) as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(
                b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'5\r\n{"in"\r\n0\r\n\r\n'
            )
            data = _recv_all(c)
        assert data.startswith(b"HTTP/1.1 400"), data[:200]
        assert data.endswith(b"<closed>"), "the connection was kept open"
        assert _metric(port, 'scalpel_refused_total{reason="content_length_with_transfer_encoding"}') == 1

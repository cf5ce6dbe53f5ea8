"""Bind policy, token checks, streamed body limits, token files (--max-body sizes: test_units.py)."""

from __future__ import annotations

import asyncio
import os

import pytest

from torchscalpel.errors import UsageError
from torchscalpel.serve.errors import RequestError
from torchscalpel.serve.security import (
    check_bind,
    check_token,
    is_loopback,
    read_limited,
    read_token,
)


@pytest.mark.parametrize(
    ("host", "loop"),
    [
        ("127.0.0.1", True),
        ("127.5.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host, loop):
    assert is_loopback(host) is loop


def test_non_loopback_needs_a_token():
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "x" * 20)
    with pytest.raises(UsageError, match="token"):
        check_bind("0.0.0.0", None)


def test_check_token():
    check_token(None, None)
    check_token("Bearer " + "s" * 20, "s" * 20)
    check_token("bearer " + "s" * 20, "s" * 20)
    for header in (None, "", "Bearer wrong", "Basic " + "s" * 20, "Bearer " + "s" * 19, "s" * 20):
        with pytest.raises(RequestError) as info:
            check_token(header, "s" * 20)
        assert info.value.status == 401 and info.value.headers["WWW-Authenticate"] == "Bearer"


async def _chunks(parts, delay=0.0):
    for p in parts:
        if delay:
            await asyncio.sleep(delay)
        yield p


def test_read_limited_counts_streamed_bytes_whatever_content_length_says():
    body = asyncio.run(read_limited(_chunks([b"ab", b"cd"]), "4", 10, 1))
    assert body == b"abcd"
    with pytest.raises(RequestError) as info:  # honest but too big: refused before reading
        asyncio.run(read_limited(_chunks([b"x"]), "11", 10, 1))
    assert info.value.status == 413
    with pytest.raises(RequestError) as info:  # lying Content-Length: the stream count catches it
        asyncio.run(read_limited(_chunks([b"x" * 6, b"y" * 6]), "5", 10, 1))
    assert info.value.status == 413
    with pytest.raises(RequestError) as info:  # no Content-Length (chunked)
        asyncio.run(read_limited(_chunks([b"x" * 8] * 3), None, 10, 1))
    assert info.value.status == 413
    with pytest.raises(RequestError) as info:
        asyncio.run(read_limited(_chunks([b"x"]), "abc", 10, 1))
    assert info.value.status == 400


def test_slow_body_is_408():
    with pytest.raises(RequestError) as info:
        asyncio.run(read_limited(_chunks([b"x"] * 10, delay=0.05), None, 100, 0.1))
    assert info.value.status == 408


def test_read_token(tmp_path):
    f = tmp_path / "token"
    f.write_text("a" * 32 + "\n")
    os.chmod(f, 0o600)
    assert read_token(f) == "a" * 32
    os.chmod(f, 0o644)
    with pytest.raises(UsageError, match="chmod"):
        read_token(f)
    f.write_text("short")
    os.chmod(f, 0o600)
    with pytest.raises(UsageError, match="shorter"):
        read_token(f)
    with pytest.raises(UsageError, match="does not exist"):
        read_token(tmp_path / "missing")

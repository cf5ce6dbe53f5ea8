"""The listening socket and the uvicorn settings of ``scalpel serve`` (shared by the CLI and tests).

The socket is made with ``IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` on accepted connections only
when the listening socket's protocol says TCP, and without it every keep-alive response waits for a
delayed ACK (Nagle), about 40 ms on Linux.
"""

from __future__ import annotations

import socket

from torchscalpel.errors import UsageError


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for ``host:port`` (IPv6 when ``host`` has a colon); one sentence if it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"Cannot bind {host}:{port} ({exc.strerror}); choose another --port or --host.") from None
    return sock

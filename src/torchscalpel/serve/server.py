"""The listening socket and the uvicorn settings of ``scalpel serve`` (shared by the CLI and tests).

The socket is made with ``IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` on accepted connections only
when the listening socket's protocol says TCP, and without it every keep-alive response waits for a
delayed ACK (Nagle), about 40 ms on Linux.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

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
        raise UsageError(
            f"Cannot bind {host}:{port} ({exc.strerror}); choose another --port or --host."
        ) from None
    return sock


def guarded_protocol(
    metrics: Any, *, header_timeout_s: float, max_per_client: int, max_connections: int
) -> type:
    """uvicorn's h11 protocol with connection limits that idle and slow clients cannot exhaust.

    - A connection must deliver a request's headers within ``header_timeout_s`` of connecting (or
      of sending the first byte after a keep-alive pause); otherwise it is closed quietly. The same
      bound applies while no request is being answered (a body trickled after the answer). Between
      requests, uvicorn's ``timeout_keep_alive`` closes an idle connection.
    - At most ``max_per_client`` open connections per client address, and ``max_connections`` in
      all, so one address cannot take every slot and ``/healthz`` keeps answering other clients. When
      an address is at its limit, its oldest connection that has not sent a request yet is closed to
      make room (``per_client_evicted_idle``): idle sockets cannot lock the address out, which behind a
      reverse proxy is every client. Only when all of them are busy is the new one closed at once.

    Every closed connection is counted in ``scalpel_refused_total{reason}``.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    # the open connections of each address, oldest first (dicts keep insertion order)
    per_client: dict[str, dict[Any, None]] = {}
    open_total = [0]

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._guard_host: str | None = None
            self._header_timer: asyncio.TimerHandle | None = None
            self._had_request = False
            host = self.client[0] if self.client else "?"
            mine = per_client.setdefault(host, {})
            if len(mine) >= max_per_client:
                idle = next((p for p in mine if not p._had_request), None)
                if idle is not None:
                    metrics.record_refused("per_client_evicted_idle")
                    idle._release()  # counted out now: its connection_lost comes later
                    idle.transport.abort()
            if open_total[0] >= max_connections or len(mine) >= max_per_client:
                metrics.record_refused(
                    "connection_limit" if open_total[0] >= max_connections else "per_client_limit"
                )
                if not mine:
                    del per_client[host]
                transport.abort()
                return
            mine[self] = None
            open_total[0] += 1
            self._guard_host = host
            self._arm_header_timer()

        def _release(self) -> None:
            if self._guard_host is not None:
                mine = per_client.get(self._guard_host, {})
                mine.pop(self, None)
                if not mine:
                    per_client.pop(self._guard_host, None)
                open_total[0] -= 1
                self._guard_host = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            self._release()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None:  # a whole request head arrived: no longer an idle socket to evict
                self._had_request = True
            if self._answering():
                self._disarm_header_timer()
            elif not self.transport.is_closing():
                self._arm_header_timer()

        # asyncio.Protocol.eof_received may return True (keep the transport open); uvicorn annotates None.
        def eof_received(self) -> bool | None:  # type: ignore[override]
            """The client half-closed (``shutdown(SHUT_WR)``): answer a request it sent whole, then close.

            uvicorn's own handler returns None, so asyncio closed the transport at once and the answer
            to a complete request was dropped. A request still arriving (its head or body cut short) or
            no request at all has nobody to answer: those still close now.
            """
            cycle = self.cycle
            if (
                cycle is not None
                and not cycle.response_complete
                and self.conn.their_state in (h11.DONE, h11.MUST_CLOSE)
            ):
                cycle.keep_alive = False  # uvicorn closes the transport once this answer is written
                return True  # keep the transport open for writing; asyncio stops reading it
            return None

        def _answering(self) -> bool:
            """True while the app is handling a request (its own body and answer timeouts apply)."""
            return self.cycle is not None and not self.cycle.response_complete

        def _arm_header_timer(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self._answering() or self.transport.is_closing():
                return
            metrics.record_refused("header_timeout" if self.conn.their_state is h11.IDLE else "slow_request")
            self.transport.close()

    return GuardedH11Protocol


def uvicorn_settings(app: Any, config: Any) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config`` from a :class:`~torchscalpel.serve.app.ServeConfig`."""
    return {
        "http": guarded_protocol(
            app.state.metrics,
            header_timeout_s=config.header_timeout_s,
            max_per_client=config.max_connections_per_client,
            max_connections=config.max_connections,
        ),
        # The connection cap above replaces uvicorn's limit_concurrency, whose bare 503 also hit /healthz.
        "limit_concurrency": None,
        "timeout_keep_alive": config.keepalive_s,
        "h11_max_incomplete_event_size": 64 * 1024,
    }

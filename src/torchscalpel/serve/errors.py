"""The one exception request handling raises: an HTTP status and a one-sentence reason."""

from __future__ import annotations


class RequestError(Exception):
    """A request the server refuses: ``status`` (4xx/5xx), ``reason`` (shown to the client), extra headers."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers or {}

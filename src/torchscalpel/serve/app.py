"""The FastAPI app: ``POST /v1/predict``, ``GET /v1/model``, ``/healthz``, ``/readyz``, ``/metrics``.

No endpoint loads, swaps or manages models: the app serves the one runner it was built with.
Request handling order for predict: token (401), content type (415, from the headers), body size and
read time (413/408), decoding and validation (422), queueing (503 when full), answer or timeout (504).
An answer given before the body's end closes the connection (:class:`ConnectionGuard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from torchscalpel.serve.batcher import Batcher
from torchscalpel.serve.codec import (
    DEFAULT_MAX_BODY,
    AnyPreprocessor,
    InputSpec,
    body_cap,
    decode,
    media_type,
    raw_body_cap,
)
from torchscalpel.serve.errors import RequestError
from torchscalpel.serve.metrics import Metrics
from torchscalpel.serve.schema import ERROR_SCHEMA, predict_openapi
from torchscalpel.serve.security import CLIENT_CLOSED, check_token, read_limited
from torchscalpel.ship.bundle import Bundle, axis_bounds
from torchscalpel.ship.preprocess import Preprocessor, is_spec
from torchscalpel.ship.runners import Runner
from torchscalpel.ship.textprep import TextPreprocessor, is_text_spec

MAX_SECONDS = 86400.0
"""Longest timeout a flag may set (a day); beyond that is a typo, and asyncio timers misbehave near inf."""


@dataclass(kw_only=True, slots=True)
class ServeConfig:
    """Server limits (the ``scalpel serve`` flags)."""

    max_batch: int = 32
    """Most rows in one model call (capped by the bundle's checked maximum)."""
    max_wait_ms: float = 5.0
    """How long the oldest queued request waits for others to join its batch."""
    max_queue: int = 256
    """Requests allowed to wait; one more answers 503."""
    timeout_s: float = 10.0
    """A request not answered within this answers 504."""
    max_body: int | None = None
    """Largest request body; None: the most a valid request for the bundle can need (:func:`codec.body_cap`)."""
    body_timeout_s: float = 10.0
    """A body that takes longer to arrive answers 408 (slow clients)."""
    token: str | None = None
    decode_threads: int = 2
    """Threads decoding and validating large bodies (off the event loop)."""
    decode_budget_factor: int = 2
    """Bodies being decoded at once hold at most this many times ``max_body`` bytes."""
    header_timeout_s: float = 10.0
    """A connection that has not sent a whole request head within this is closed (slowloris, idle sockets)."""
    keepalive_s: float = 5.0
    """An idle keep-alive connection is closed after this."""
    max_connections_per_client: int = 256
    """Open connections one client address may hold; more are closed at once."""
    max_connections: int = 1024
    """Open connections in all; more are closed at once."""

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"--max-batch must be at least 1, not {self.max_batch}")
        # "not (x > 0)" and isfinite so that NaN (which compares false to everything) is refused too.
        if not (math.isfinite(self.max_wait_ms) and 0 <= self.max_wait_ms <= MAX_SECONDS * 1e3):
            raise ValueError(
                f"--max-wait-ms must be a number of milliseconds from 0 to {MAX_SECONDS * 1000:g}, "
                f"not {self.max_wait_ms:g}"
            )
        for flag, value in (
            ("--timeout", self.timeout_s),
            ("--body-timeout", self.body_timeout_s),
            ("--header-timeout", self.header_timeout_s),
            ("--keepalive-timeout", self.keepalive_s),
        ):
            if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
                raise ValueError(
                    f"{flag} must be a number of seconds above 0 and at most {MAX_SECONDS:g}, not {value:g}"
                )
        if self.max_queue < 1 or (self.max_body is not None and self.max_body < 1):
            raise ValueError("--max-queue and --max-body must be at least 1")
        if not (1 <= self.decode_threads <= 64 and 1 <= self.decode_budget_factor <= 64):
            raise ValueError("decode_threads and decode_budget_factor must be 1 to 64")
        if not 1 <= self.max_connections_per_client <= self.max_connections <= 1 << 20:
            raise ValueError(
                f"--max-connections-per-client ({self.max_connections_per_client}) must be at least 1 "
                f"and at most --max-connections ({self.max_connections}, at most {1 << 20})"
            )


INLINE_DECODE_BYTES = 64 << 10
"""Bodies up to this decode on the event loop (well under a millisecond); larger ones in the decode pool."""


class ByteBudget:
    """At most ``limit`` bytes held at once; a request waits (in arrival order) until its bytes fit.

    A request never holds more than ``--max-body`` bytes and the limit is a multiple of it, so every
    request fits eventually; meanwhile waiting requests keep the event loop free.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._cond: asyncio.Condition | None = None

    @contextlib.asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        """Hold ``n`` bytes of the budget for the body of the ``async with``."""
        if self._cond is None:
            self._cond = asyncio.Condition()
        n = min(n, self.limit)
        async with self._cond:
            await self._cond.wait_for(lambda: self.held + n <= self.limit)
            self.held += n
        try:
            yield
        finally:
            async with self._cond:
                self.held -= n
                self._cond.notify_all()


def _jsonable(arr: np.ndarray) -> list:
    """Nested lists for JSON; NaN and infinities become null (strict JSON has no spelling for them)."""
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        obj = arr.astype(object)
        obj[~np.isfinite(arr)] = None
        return obj.tolist()
    return arr.tolist()


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a reason quoting a client's lone surrogate still encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _error(exc: RequestError) -> JSONResponse:
    return AsciiJSONResponse({"error": exc.reason}, status_code=exc.status, headers=exc.headers)


def _has_body(headers: Any) -> bool:
    """True when the request head announces a body (a non-zero Content-Length or any Transfer-Encoding)."""
    for name, value in headers:
        name = name.lower()
        if name == b"transfer-encoding":
            return True
        if name == b"content-length":
            try:
                return int(value) != 0
            except ValueError:
                return True  # h11 refuses such a head before the app sees it; count it as a body anyway
    return False


class ConnectionGuard:
    """ASGI middleware: decide when a connection may stay open after its answer.

    - A request with both Content-Length and Transfer-Encoding answers 400 and closes (RFC 9112
      section 6.3: it may be a request-smuggling attempt; h11 would silently prefer the chunked
      framing and keep the connection open).
    - An answer sent before the request's body arrived to its end (401, 413, 415, 408 and any other
      refusal) carries ``Connection: close``, so uvicorn closes the transport once the answer is
      written. Kept open, the connection would make h11 receive and parse the rest of the refused
      body, up to its Content-Length or, chunked, for as long as the client cares to send (5.2 GB
      in 10 s on one connection, issue 41).
    """

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", ())
        names = {k.lower() for k, _ in headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            self.metrics.record_refused("content_length_with_transfer_encoding")
            body = b'{"error":"a request may not carry both Content-Length and Transfer-Encoding"}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 400,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"connection", b"close"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        body_ended = not _has_body(headers)
        client_gone = False

        async def tracking_receive() -> Any:
            nonlocal body_ended, client_gone
            message = await receive()
            if message["type"] == "http.disconnect":
                client_gone = True
            elif not message.get("more_body", False):
                body_ended = True
            return message

        async def closing_send(message: Any) -> None:
            if message["type"] == "http.response.start" and not body_ended:
                kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
                message = {**message, "headers": [*kept, (b"connection", b"close")]}
                if not client_gone:  # a client that hung up mid-body is counted as client_closed_mid_body
                    self.metrics.record_refused("answered_before_body_end")
            await send(message)

        await self.app(scope, tracking_receive, closing_send)


def preprocessor_for(bundle: Bundle) -> AnyPreprocessor | None:
    """The bundle's preprocessing as applied to ``"raw"`` requests: an image/tensor spec, a tokenizer, or None."""
    spec = bundle.manifest.get("preprocessing")
    if not isinstance(spec, dict):
        return None
    if is_text_spec(spec):
        return TextPreprocessor(spec, bundle.path)
    return Preprocessor(spec) if is_spec(spec) else None


def create_app(bundle: Bundle, runner: Runner, config: ServeConfig) -> FastAPI:
    """Build the app for one bundle and runner; the batcher starts with the app's lifespan."""
    axes = axis_bounds(bundle.manifest)
    specs = [InputSpec.from_manifest(e, axes) for e in bundle.inputs]
    out_names = [o["name"] for o in bundle.outputs]
    # Never batch beyond what parity checked; a static-batch export takes exactly its batch.
    max_batch = min(config.max_batch, bundle.max_batch)
    static = specs[0].shape[0] is not None
    limit_rows = bundle.max_batch if static else max_batch
    # A valid request's size is known from the manifest: a larger body is refused before it is read or parsed,
    # so abusive 10 MB bodies cannot hold the GIL (parsing them cost ~0.85 s each).
    pre = preprocessor_for(bundle)
    max_body = config.max_body or body_cap(specs, limit_rows) or DEFAULT_MAX_BODY
    if pre is not None and config.max_body is None:  # raw samples may be larger than the model input
        max_body = max(max_body, raw_body_cap(pre, limit_rows) or DEFAULT_MAX_BODY)
    metrics = Metrics()
    state: dict[str, Any] = {"batcher": None, "ready": False, "arriving": 0, "decode_pool": None}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        rows = bundle.max_batch if static else 1
        warm = [np.full(s.warm_shape(rows), s.low or 0, dtype=s.dtype) for s in specs]
        await asyncio.get_running_loop().run_in_executor(
            None, runner, warm
        )  # first call allocates; not a user's cost
        batcher = Batcher(
            runner,
            max_batch=bundle.max_batch if static else max_batch,
            max_wait_s=config.max_wait_ms / 1e3,
            max_queue=config.max_queue,
            timeout_s=config.timeout_s,
            on_batch=metrics.record_batch,
            arriving=lambda: state["arriving"],
        )
        batcher.start()
        # Decoding a large JSON body costs ~30 ms of CPU per MB: off the event loop, in a bounded pool,
        # the bodies being decoded at once bounded in bytes (each request counts its body size).
        decode_pool = ThreadPoolExecutor(
            max_workers=config.decode_threads, thread_name_prefix="scalpel-decode"
        )
        state["decode_pool"] = decode_pool
        state["decode_budget"] = ByteBudget(config.decode_budget_factor * max_body)
        state["batcher"], state["ready"] = batcher, True
        try:
            yield
        finally:
            state["ready"] = False
            await batcher.stop()
            state["decode_pool"] = None
            decode_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="torchscalpel model server",
        version=str(bundle.manifest.get("format_version")),
        description=f"Serves {bundle.manifest['model'].get('class', 'a model')} from a verified bundle.",
        docs_url=None,
        redoc_url=None,
        # no 307 from /v1/predict/ to /v1/predict: its Location is built from the client's Host header
        redirect_slashes=False,
        lifespan=lifespan,
    )

    def finish(path: str, started: float, response: Response) -> Response:
        metrics.record_request(path, response.status_code, time.perf_counter() - started)
        return response

    @app.post(
        "/v1/predict",
        openapi_extra=predict_openapi(specs, bundle.outputs, max_batch, raw=pre is not None),
        responses={200: {"description": "model outputs"}},
    )
    async def predict(request: Request) -> Response:
        started = time.perf_counter()
        state["arriving"] += 1
        arriving = True
        try:
            check_token(request.headers.get("authorization"), config.token)
            # 415 from the headers alone: a body the server cannot decode is not worth receiving.
            ctype = media_type(request.headers.get("content-type"))
            body = await read_limited(
                request.stream(),
                request.headers.get("content-length"),
                max_body,
                config.body_timeout_s,
            )
            decode_pool = state["decode_pool"]
            if len(body) <= INLINE_DECODE_BYTES or decode_pool is None:
                arrays = decode(body, ctype, specs, limit_rows, pre)  # faster than a thread hop
            else:
                async with state["decode_budget"].hold(len(body)):
                    arrays = await asyncio.get_running_loop().run_in_executor(
                        decode_pool, decode, body, ctype, specs, limit_rows, pre
                    )
            del body
            batcher: Batcher | None = state["batcher"]
            if batcher is None or not state["ready"]:
                raise RequestError(503, "server is starting", {"Retry-After": "1"})
            state["arriving"] -= 1
            arriving = False
            outputs = await batcher.submit(arrays)
            payload = {
                "outputs": {n: _jsonable(o) for n, o in zip(out_names, outputs, strict=True)},
                "batch_size": int(arrays[0].shape[0]),
            }
            response: Response = Response(json.dumps(payload, allow_nan=False), media_type="application/json")
        except RequestError as exc:
            if exc.status == CLIENT_CLOSED:
                metrics.record_refused("client_closed_mid_body")
            response = _error(exc)
        finally:
            if arriving:
                state["arriving"] -= 1
                if state["batcher"] is not None:
                    state["batcher"].poke()
        return finish("/v1/predict", started, response)

    @app.get(
        "/v1/model",
        responses={
            200: {"description": "inputs, outputs and limits of the served model"},
            401: {"description": "token", "content": {"application/json": {"schema": ERROR_SCHEMA}}},
        },
    )
    async def model_info(request: Request) -> Response:
        started = time.perf_counter()
        try:
            check_token(request.headers.get("authorization"), config.token)
            m = bundle.manifest
            response: Response = JSONResponse(
                {
                    "inputs": m["inputs"],
                    "outputs": m["outputs"],
                    "max_batch": max_batch,
                    "preprocessing": m.get("preprocessing"),
                    "class": m["model"].get("class"),
                    "parity_passed": m["parity"]["passed"],
                }
            )
        except RequestError as exc:
            response = _error(exc)
        return finish("/v1/model", started, response)

    @app.get("/healthz", responses={200: {"description": "the process is up"}})
    async def healthz() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get(
        "/readyz", responses={200: {"description": "ready to predict"}, 503: {"description": "not ready"}}
    )
    async def readyz() -> Response:
        batcher: Batcher | None = state["batcher"]
        if state["ready"] and batcher is not None and batcher.running:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready"}, status_code=503, headers={"Retry-After": "1"})

    @app.get(
        "/metrics",
        responses={
            200: {
                "description": "Prometheus text format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            401: {"description": "token", "content": {"application/json": {"schema": ERROR_SCHEMA}}},
        },
    )
    async def metrics_endpoint(request: Request) -> Response:
        try:
            check_token(request.headers.get("authorization"), config.token)
        except RequestError as exc:
            return _error(exc)
        batcher: Batcher | None = state["batcher"]
        if batcher is None:
            return PlainTextResponse("", status_code=503)
        return PlainTextResponse(
            metrics.render(batcher.stats, batcher.depth),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    app.add_middleware(ConnectionGuard, metrics=metrics)
    app.state.metrics = metrics
    app.state.max_body = max_body
    app.state.serve_state = state
    return app

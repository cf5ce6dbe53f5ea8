"""``scalpel serve BUNDLE``: a safe, batching HTTP server for an exported bundle (see docs/serve.md)."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from torchscalpel.errors import UsageError
from torchscalpel.units import duration_type, fmt_bytes


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``serve`` sub-parser."""
    p = subparsers.add_parser(
        "serve",
        help="serve an exported bundle over HTTP with dynamic batching (loopback by default)",
        description="Verify a bundle's hashes and serve it: POST /v1/predict, /healthz, /readyz, /metrics, /openapi.json.",
    )
    p.add_argument("bundle", type=Path, metavar="BUNDLE", help="folder written by 'scalpel export'")
    p.add_argument(
        "--backend",
        default="onnxruntime",
        choices=["onnxruntime", "torch"],
        help="onnxruntime (model.onnx, default) or torch (model.pt2; needs --trust)",
    )
    p.add_argument("--quantized", action="store_true", help="serve the int8 ONNX model (export --quantize)")
    p.add_argument(
        "--precision",
        choices=["fp16", "bf16"],
        help="serve a reduced-precision form export kept (export --precision): fp16 with --backend onnxruntime, "
        "bf16 with --backend torch",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="run the torch program under torch.compile (--backend torch); compiled at batch 1 and the max batch "
        "before the server accepts requests",
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cpu (default) or cuda: onnxruntime's CUDA execution provider, or the torch program on the GPU; "
        "refused in one sentence where CUDA is not available",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --token-file)"
    )
    p.add_argument(
        "--port", type=int, default=8000, help="port (default 8000; 0 picks a free one and prints it)"
    )
    p.add_argument(
        "--max-batch", type=int, default=32, help="most rows per model call (default 32; 1 disables batching)"
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        help="how long a request waits for others to batch with (default 5)",
    )
    p.add_argument(
        "--max-queue", type=int, default=256, help="requests allowed to wait; more answer 503 (default 256)"
    )
    p.add_argument(
        "--timeout",
        type=duration_type("--timeout"),
        metavar="DURATION",
        default=10.0,
        help="seconds before a queued request answers 504 (default 10)",
    )
    p.add_argument(
        "--max-body",
        default=None,
        metavar="SIZE",
        help="largest request body (default: the most a valid request for the bundle can need, from its "
        "manifest; 10MiB when a dimension besides the batch is dynamic); larger answers 413. "
        "KB/MB/GB are 10^3/10^6/10^9 bytes, "
        "KiB/MiB/GiB 2^10/2^20/2^30, a bare number is bytes",
    )
    p.add_argument(
        "--body-timeout",
        type=duration_type("--body-timeout"),
        metavar="DURATION",
        default=10.0,
        help="seconds to receive a body before 408 (default 10)",
    )
    p.add_argument(
        "--header-timeout",
        type=duration_type("--header-timeout"),
        metavar="DURATION",
        default=10.0,
        help="seconds a connection has to send a request's headers before it is closed (default 10)",
    )
    p.add_argument(
        "--keepalive-timeout",
        type=duration_type("--keepalive-timeout"),
        metavar="DURATION",
        default=5.0,
        help="seconds an idle keep-alive connection stays open (default 5)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="open connections in all; more are closed (default 1024)",
    )
    p.add_argument(
        "--max-connections-per-client",
        type=int,
        default=256,
        help="open connections per client address; more are closed (default 256)",
    )
    p.add_argument(
        "--token-file", type=Path, help="file whose first line is the bearer token clients must send"
    )
    p.add_argument(
        "--threads", type=int, default=0, help="intra-op threads for the model (default 0: runtime decides)"
    )
    p.add_argument(
        "--trust", action="store_true", help="allow .pt2/TorchScript artifacts, which unpickle code"
    )
    p.add_argument(
        "--sign-key",
        type=Path,
        metavar="FILE",
        help="HMAC key file: refuse a bundle whose manifest.sig (written by 'scalpel export --sign-key') "
        "is missing or does not match",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate everything (flags, token, bundle hashes, backend) before binding, then serve until Ctrl-C."""
    from torchscalpel.serve.security import check_bind, read_token
    from torchscalpel.units import parse_size

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a valid port (0-65535).")
    if not 0 <= args.threads <= 1024:
        raise UsageError(
            f"--threads {args.threads} is not a thread count; pass 0 (the runtime decides) or 1 to 1024."
        )
    token = read_token(args.token_file) if args.token_file else None
    check_bind(args.host, token)
    key = _read_sign_key(args.sign_key) if args.sign_key is not None else None
    from torchscalpel.serve.app import ServeConfig, create_app
    from torchscalpel.serve.backends import check_runner, load_runner
    from torchscalpel.ship.bundle import verify_bundle

    try:
        config = ServeConfig(
            max_batch=args.max_batch,
            max_wait_ms=args.max_wait_ms,
            max_queue=args.max_queue,
            timeout_s=args.timeout,
            max_body=parse_size(args.max_body, flag="--max-body") if args.max_body is not None else None,
            body_timeout_s=args.body_timeout,
            token=token,
            header_timeout_s=args.header_timeout,
            keepalive_s=args.keepalive_timeout,
            max_connections=args.max_connections,
            max_connections_per_client=args.max_connections_per_client,
        )
    except ValueError as exc:
        raise UsageError(f"{exc}.") from None
    if args.device != "cpu":  # refused before the bundle is hashed: nothing else matters without the device
        from torchscalpel.ship.runners import ort_providers, torch_device

        if args.backend == "onnxruntime":
            ort_providers(args.device)
        else:
            torch_device(args.device)
    bundle = verify_bundle(args.bundle, key=key)
    runner = load_runner(
        bundle,
        args.backend,
        trust=args.trust,
        quantized=args.quantized,
        threads=args.threads,
        device=args.device,
        precision=args.precision,
        compile=args.compile,
    )
    if args.compile:
        import time

        from torchscalpel.serve.backends import warm_compiled

        t0 = time.perf_counter()
        warmed = warm_compiled(bundle, runner, args.max_batch)
        print(
            f"compiled at batch {', '.join(map(str, warmed))} in {time.perf_counter() - t0:.1f} s", flush=True
        )
    check_runner(bundle, runner)
    app = create_app(bundle, runner, config)

    import uvicorn

    from torchscalpel.serve.server import listen_socket, uvicorn_settings

    sock = listen_socket(args.host, args.port)
    port = sock.getsockname()[1]
    host = f"[{args.host}]" if sock.family == socket.AF_INET6 else args.host
    banner = (
        f"serving {bundle.path} ({runner.name}, max batch {min(config.max_batch, bundle.max_batch)}, "
        f"max body {fmt_bytes(app.state.max_body)}) "
        f"on http://{host}:{port}{' (token required)' if token else ''}"
    )

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                # Printed only once the socket accepts and the model is warm: scripts wait for this line.
                print(banner, flush=True)

    server = _Server(
        uvicorn.Config(app, log_level="warning", access_log=False, **uvicorn_settings(app, config))
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    print("server stopped", file=sys.stderr)
    return 0


def _read_sign_key(path: Path) -> bytes:
    """The --sign-key file's bytes; a missing, unreadable or short key is a usage error (exit 2, as in export)."""
    from torchscalpel.distributed.manifest import CheckpointError, read_key

    try:
        return read_key(path)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None

"""Robustness: thousands of malformed requests against `scalpel serve` on 127.0.0.1.

Every malformed request must get a 4xx (never a 5xx, never a dropped connection without an
answer), the server must stay up, its memory must grow by less than 50 MB, and valid requests
sent in between must still be answered correctly. Loopback only, bounded in count and time.

    python benchmarks/serve_fuzz.py --count 10000 --json fuzz.json

Without --bundle it exports the digits CNN from tests/fixtures (random weights) first.
The request generator is also used by tests/unit/test_serve_robustness.py on a smaller count.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
SHAPE = (1, 8, 8)  # the digits bundle's per-row shape; override with --row-shape for other bundles


def http(
    method: str, path: str, body: bytes, headers: dict[str, str] | None = None, *, length: str | None = None
) -> bytes:
    """A raw HTTP/1.1 request (Content-Length is the true length unless ``length`` overrides it)."""
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    for k, v in (headers or {}).items():
        head.append(f"{k}: {v}")
    if length != "omit":
        head.append(f"Content-Length: {length if length is not None else len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _json(obj: object, **headers: str) -> bytes:
    return http(
        "POST", "/v1/predict", json.dumps(obj).encode(), {"Content-Type": "application/json", **headers}
    )


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def valid_request(rng: random.Random, row_shape: tuple[int, ...]) -> tuple[bytes, int]:
    """A well-formed JSON request and its batch size."""
    n = rng.randint(1, 4)
    x = np.asarray([[rng.random() for _ in range(int(np.prod(row_shape)))] for _ in range(n)], np.float32)
    return _json({"inputs": x.reshape(n, *row_shape).tolist()}), n


def malformed(rng: random.Random, row_shape: tuple[int, ...], max_body: int) -> Iterator[tuple[str, bytes]]:
    """An endless stream of (category, raw request) pairs, each of which must be refused with a 4xx."""
    good = np.zeros((2, *row_shape), np.float32)
    good_npy = _npy(good)
    cases = [
        (
            "random-bytes-json",
            lambda: http(
                "POST",
                "/v1/predict",
                rng.randbytes(rng.randint(0, 4000)),
                {"Content-Type": "application/json"},
            ),
        ),
        (
            "random-bytes-npy",
            lambda: http(
                "POST",
                "/v1/predict",
                rng.randbytes(rng.randint(0, 4000)),
                {"Content-Type": "application/x-npy"},
            ),
        ),
        (
            "npy-magic-garbage",
            lambda: http(
                "POST",
                "/v1/predict",
                b"\x93NUMPY\x01\x00" + rng.randbytes(rng.randint(0, 300)),
                {"Content-Type": "application/x-npy"},
            ),
        ),
        (
            "wrong-shape",
            lambda: _json(
                {"inputs": np.zeros([rng.randint(1, 5) for _ in range(rng.randint(1, 6))]).tolist()}
            ),
        ),
        ("batch-too-big", lambda: _json({"inputs": np.zeros((rng.randint(33, 60), *row_shape)).tolist()})),
        (
            "nan-inf",
            lambda: http(
                "POST",
                "/v1/predict",
                json.dumps({"inputs": [[[[0.0] * row_shape[-1]] * row_shape[-2]]]})
                .replace("0.0", rng.choice(["NaN", "Infinity", "-Infinity", "1e39"]), 1)
                .encode(),
                {"Content-Type": "application/json"},
            ),
        ),
        (
            "npy-huge-dims",
            lambda: http(
                "POST",
                "/v1/predict",
                good_npy.replace(
                    b"(2, " + ", ".join(map(str, row_shape)).encode(),
                    b"("
                    + str(rng.choice([2**31, 2**40, 10**12])).encode()
                    + b", "
                    + ", ".join(map(str, row_shape)).encode(),
                ),
                {"Content-Type": "application/x-npy"},
            ),
        ),
        (
            "npy-negative-dims",
            lambda: http(
                "POST",
                "/v1/predict",
                good_npy.replace(b"(2, ", b"(-2, "),
                {"Content-Type": "application/x-npy"},
            ),
        ),
        (
            "npy-wrong-dtype",
            lambda: http(
                "POST",
                "/v1/predict",
                _npy(good.astype(rng.choice(["complex64", "U1", "int8"]))),
                {"Content-Type": "application/x-npy"},
            ),
        ),
        (
            "deep-nesting",
            lambda: http(
                "POST",
                "/v1/predict",
                b'{"inputs": ' + b"[" * rng.randint(500, 100_000),
                {"Content-Type": "application/json"},
            ),
        ),
        (
            "truncated-json",
            lambda: (
                lambda b: http(
                    "POST",
                    "/v1/predict",
                    b[: rng.randint(0, len(b) - 1)],
                    {"Content-Type": "application/json"},
                )
            )(json.dumps({"inputs": good.tolist()}).encode()),
        ),
        (
            "truncated-npy",
            lambda: http(
                "POST",
                "/v1/predict",
                good_npy[: rng.randint(0, len(good_npy) - 1)],
                {"Content-Type": "application/x-npy"},
            ),
        ),
        (
            "wrong-types",
            lambda: _json({"inputs": rng.choice([None, "x", True, {"a": 1}, [["a"]], [[None]], 3.5])}),
        ),
        (
            "missing-inputs",
            lambda: _json(rng.choice([{}, [], {"input": []}, {"inputs": {"nope": [1]}}, 1, "s"])),
        ),
        (
            "big-ints",
            lambda: http(
                "POST",
                "/v1/predict",
                b'{"inputs": [[' + b"9" * rng.randint(20, 6000) + b"]]}",
                {"Content-Type": "application/json"},
            ),
        ),
        (
            "invalid-utf8",
            lambda: http(
                "POST", "/v1/predict", b'{"inputs": "\xff\xfe\xfd"}', {"Content-Type": "application/json"}
            ),
        ),
        (
            "wrong-content-type",
            lambda: http(
                "POST",
                "/v1/predict",
                b"a,b,c",
                {"Content-Type": rng.choice(["text/csv", "multipart/form-data", "image/png"])},
            ),
        ),
        (
            "oversize-declared",
            lambda: http(
                "POST",
                "/v1/predict",
                b"",
                {"Content-Type": "application/json"},
                length=str(max_body + rng.randint(1, 10**9)),
            ),
        ),
        (
            "oversize-chunked",
            lambda: http(
                "POST",
                "/v1/predict",
                b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in [b"[" * 65536] * (max_body // 65536 + 2))
                + b"0\r\n\r\n",
                {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                length="omit",
            ),
        ),
        (
            "lying-short-length",
            lambda: http(
                "POST",
                "/v1/predict",
                json.dumps({"inputs": good.tolist()}).encode(),
                {"Content-Type": "application/json"},
                length=str(rng.randint(1, 20)),
            ),
        ),
        (
            "bad-content-length",
            lambda: http(
                "POST",
                "/v1/predict",
                b"{}",
                {"Content-Type": "application/json"},
                length=rng.choice(["abc", "-5", "1e3", ""]),
            ),
        ),
        ("wrong-method", lambda: http(rng.choice(["GET", "PUT", "DELETE", "PATCH"]), "/v1/predict", b"")),
        (
            "unknown-path",
            lambda: http(
                "POST", rng.choice(["/", "/v2/predict", "/admin", "/../etc/passwd", "/v1/models/load"]), b"{}"
            ),
        ),
        ("garbage-request-line", lambda: rng.randbytes(rng.randint(1, 200)) + b"\r\n\r\n"),
    ]
    while True:
        name, make = rng.choice(cases)
        yield name, make()


def send(port: int, data: bytes, timeout: float = 30.0) -> int | None:
    """Send raw bytes to the loopback server; return the HTTP status or None when no answer came."""
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (413) and close before it has read everything
        buf = b""
        try:
            while b"\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    match = re.match(rb"HTTP/1\.[01] (\d{3})", buf)
    return int(match.group(1)) if match else None


def slow_client(port: int, stall_s: float) -> int | None:
    """Send headers and a few body bytes, then stall: the server must answer 408 (not hang forever)."""
    with socket.create_connection((LOOPBACK, port), timeout=stall_s + 30) as s:
        s.sendall(http("POST", "/v1/predict", b"", {"Content-Type": "application/json"}, length="1000"))
        s.sendall(b'{"inputs": ')
        buf = b""
        try:
            while b"\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    match = re.match(rb"HTTP/1\.[01] (\d{3})", buf)
    return int(match.group(1)) if match else None


def run_fuzz(
    port: int,
    *,
    count: int,
    seed: int = 0,
    row_shape: tuple[int, ...] = SHAPE,
    max_body: int = 256 << 10,
    valid_every: int = 50,
    workers: int = 4,
    time_limit_s: float = 900,
    rss=None,
    slow_clients: int = 0,
    body_timeout_s: float = 2.0,
) -> dict:
    """Send ``count`` malformed requests (plus a valid one every ``valid_every``); return the tallies."""
    rng = random.Random(seed)
    gen = malformed(rng, row_shape, max_body)
    lock = threading.Lock()
    by_cat: dict[str, Counter[int | None]] = {}
    bad: list[str] = []
    valid = Counter()
    rss_samples: list[int] = []
    jobs: list[tuple[str, bytes, int]] = []
    for i in range(count):
        if valid_every and i % valid_every == 0:
            body, n = valid_request(rng, row_shape)
            jobs.append(("valid", body, n))
        name, req = next(gen)
        jobs.append((name, req, 0))
    start = time.monotonic()

    def work(job: tuple[str, bytes, int]) -> None:
        if time.monotonic() - start > time_limit_s:
            return
        name, req, _rows = job
        status = send(port, req)
        with lock:
            if name == "valid":
                valid[status] += 1
                if status != 200:
                    bad.append(f"valid request answered {status}")
            else:
                by_cat.setdefault(name, Counter())[status] += 1
                if status is None or not 400 <= status < 500:
                    bad.append(f"{name}: {status}")

    slow_results: list[int | None] = []
    slow_pool = concurrent.futures.ThreadPoolExecutor(max(slow_clients, 1))
    slow_futs = [slow_pool.submit(slow_client, port, body_timeout_s) for _ in range(slow_clients)]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for k, _ in enumerate(pool.map(work, jobs)):
            if rss is not None and k % 500 == 0:
                rss_samples.append(rss())
    slow_results = [f.result() for f in slow_futs]
    slow_pool.shutdown()
    for status in slow_results:
        by_cat.setdefault("slow-client", Counter())[status] += 1
        if status != 408:
            bad.append(f"slow-client: {status}")
    if rss is not None:
        rss_samples.append(rss())
    sent = sum(sum(c.values()) for c in by_cat.values())
    return {
        "malformed_sent": sent,
        "seconds": round(time.monotonic() - start, 1),
        "by_category": {k: {str(s): n for s, n in v.items()} for k, v in sorted(by_cat.items())},
        "not_4xx": len([b for b in bad if not b.startswith("valid")]),
        "problems": bad[:30],
        "valid": {str(k): v for k, v in valid.items()},
        "rss_mb": [round(r / 2**20, 1) for r in rss_samples],
        "rss_growth_mb": round((rss_samples[-1] - rss_samples[0]) / 2**20, 1)
        if len(rss_samples) > 1
        else None,
    }


def _export_digits(out: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "torchscalpel",
        "export",
        "--model",
        f"{REPO}/tests/fixtures/digits_model.py:make_model",
        "--example",
        "float32[1,1,8,8]",
        "--formats",
        "onnx",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")}, capture_output=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path)
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--time-limit", type=float, default=900.0)
    p.add_argument("--slow-clients", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    import psutil

    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or _export_digits(Path(tmp) / "bundle")
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torchscalpel",
                "serve",
                str(bundle),
                "--host",
                LOOPBACK,
                "--port",
                "0",
                "--max-body",
                "256KiB",
                "--body-timeout",
                "2",
                "--threads",
                "1",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not match:
            proc.kill()
            print("server did not start: " + line + proc.stdout.read(), file=sys.stderr)
            return 1
        port = int(match.group(1))
        server = psutil.Process(proc.pid)
        try:
            report = run_fuzz(
                port,
                count=args.count,
                seed=args.seed,
                time_limit_s=args.time_limit,
                rss=lambda: server.memory_info().rss,
                slow_clients=args.slow_clients,
            )
            report["server_alive"] = proc.poll() is None
            report["server_exit_code"] = proc.poll()
        finally:
            proc.terminate()
            proc.wait(15)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    ok = (
        report["server_alive"]
        and report["not_4xx"] == 0
        and set(report["valid"]) == {"200"}
        and (report["rss_growth_mb"] or 0) < 50
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

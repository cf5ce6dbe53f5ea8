"""A small run of benchmarks/serve_fuzz.py's malformed requests against a live loopback server.

The full 10,000-request run (with the server's memory) is the benchmark; here 300 requests of
every category plus slow clients must each get a 4xx while valid requests in between still get 200.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fixtures.live_server import live_server
from fixtures.serve_bundles import LinearRunner, linear_bundle
from torchscalpel.serve.app import ServeConfig, create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import serve_fuzz


def test_malformed_requests_all_get_4xx_and_server_keeps_answering(tmp_path):
    runner = LinearRunner()
    app = create_app(
        linear_bundle(tmp_path, max_batch=32),
        runner,
        ServeConfig(max_body=256 << 10, body_timeout_s=1.0, max_wait_ms=1),
    )
    with live_server(app, timeout_keep_alive=5) as (_, port):
        report = serve_fuzz.run_fuzz(
            port, count=300, seed=1, valid_every=25, workers=2, slow_clients=2, body_timeout_s=1.0
        )
    assert report["not_4xx"] == 0, report["problems"]
    assert report["valid"] == {"200": 12}
    assert report["by_category"]["slow-client"] == {"408": 2}
    assert len(report["by_category"]) >= 20  # every category was exercised
    assert sum(runner.calls) >= 12  # the valid ones really ran


def test_fuzzer_flags_a_server_error():
    """The harness itself must notice a 5xx (so the test above can fail)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]

    def answer():
        for _ in range(3):
            conn, _ = srv.accept()
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    report = serve_fuzz.run_fuzz(port, count=3, valid_every=0, workers=1)
    srv.close()
    assert report["not_4xx"] == 3

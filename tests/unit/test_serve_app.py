"""The HTTP app end to end in-process (Starlette TestClient, lifespan included) on a NumPy runner."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from fixtures.serve_bundles import LinearRunner, linear_bundle
from torchscalpel.serve.app import ServeConfig, create_app

TOKEN = "t" * 24
JSON = {"content-type": "application/json"}


@pytest.fixture()
def runner():
    return LinearRunner()


@pytest.fixture()
def client(tmp_path, runner):
    app = create_app(
        linear_bundle(tmp_path), runner, ServeConfig(max_batch=8, max_wait_ms=1, max_body=64 << 10)
    )
    with TestClient(app) as c:
        yield c


def body(n: int, seed: int = 0) -> tuple[np.ndarray, bytes]:
    x = np.random.default_rng(seed).standard_normal((n, 1, 8, 8)).astype(np.float32)
    return x, json.dumps({"inputs": x.tolist()}).encode()


def test_predict_json_and_npy(client, runner):
    x, b = body(3)
    r = client.post("/v1/predict", content=b, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    out = np.asarray(r.json()["outputs"]["logits"], np.float32)
    np.testing.assert_allclose(out, x.reshape(3, -1) @ runner.weight, rtol=1e-5, atol=1e-5)
    assert r.json()["batch_size"] == 3
    buf = io.BytesIO()
    np.save(buf, x)
    r2 = client.post("/v1/predict", content=buf.getvalue(), headers={"content-type": "application/x-npy"})
    assert r2.status_code == 200
    np.testing.assert_allclose(np.asarray(r2.json()["outputs"]["logits"]), out, rtol=1e-6)


def test_errors_have_status_and_reason(client):
    r = client.post("/v1/predict", content=b"{}", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "inputs" in r.json()["error"]
    r = client.post("/v1/predict", content=b"x", headers={"content-type": "text/csv"})
    assert r.status_code == 415
    _, big = body(8)
    r = client.post("/v1/predict", content=big * 20, headers={"content-type": "application/json"})
    assert r.status_code == 413
    _, nine = body(9)
    r = client.post("/v1/predict", content=nine, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "batch of 9" in r.json()["error"]


def test_health_ready_model_and_openapi(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    info = client.get("/v1/model").json()
    assert (
        info["inputs"][0]["name"] == "x"
        and info["max_batch"] == 8
        and info["preprocessing"] == {"scale": 0.0625}
    )
    spec = client.get("/openapi.json").json()
    req = spec["paths"]["/v1/predict"]["post"]["requestBody"]["content"]
    assert "application/x-npy" in req
    x_schema = req["application/json"]["schema"]["properties"]["inputs"]["properties"]["x"]
    assert (x_schema["minItems"], x_schema["maxItems"]) == (1, 8)
    assert x_schema["items"]["items"]["items"]["maxItems"] == 8
    assert client.get("/docs").status_code == 404  # no CDN-loaded UI


def test_metrics_count_requests_and_batches(client):
    _, b = body(2)
    for _ in range(3):
        client.post("/v1/predict", content=b, headers={"content-type": "application/json"})
    client.post("/v1/predict", content=b"nope", headers={"content-type": "application/json"})
    text = client.get("/metrics").text
    assert 'scalpel_requests_total{path="/v1/predict",code="200"} 3' in text
    assert 'scalpel_requests_total{path="/v1/predict",code="422"} 1' in text
    assert "scalpel_rows_total 6" in text
    assert "scalpel_batch_rows_count" in text and "# TYPE scalpel_queue_depth gauge" in text


def test_token_required_when_configured(tmp_path, runner):
    app = create_app(linear_bundle(tmp_path), runner, ServeConfig(token=TOKEN))
    _, b = body(1)
    with TestClient(app) as c:
        assert c.post("/v1/predict", content=b, headers=JSON).status_code == 401
        assert (
            c.post("/v1/predict", content=b, headers={**JSON, "authorization": "Bearer nope"}).status_code
            == 401
        )
        assert c.get("/metrics").status_code == 401
        assert c.get("/v1/model").status_code == 401
        assert c.get("/healthz").status_code == 200  # probes stay open
        ok = c.post("/v1/predict", content=b, headers={**JSON, "authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200


def test_server_batch_is_capped_by_bundle(tmp_path, runner):
    app = create_app(linear_bundle(tmp_path, max_batch=4), runner, ServeConfig(max_batch=32))
    _, b = body(5)
    with TestClient(app) as c:
        assert c.post("/v1/predict", content=b, headers=JSON).status_code == 422
        assert c.get("/v1/model").json()["max_batch"] == 4


def test_non_finite_outputs_are_null_in_strict_json(tmp_path):
    class NanRunner(LinearRunner):
        def __call__(self, inputs):
            out = super().__call__(inputs)[0]
            out[:, 0] = np.nan
            out[:, 1] = np.inf
            return [out]

    app = create_app(linear_bundle(tmp_path), NanRunner(), ServeConfig())
    _, b = body(2)
    with TestClient(app) as c:
        r = c.post("/v1/predict", content=b, headers=JSON)
    assert r.status_code == 200
    assert "NaN" not in r.text and "Infinity" not in r.text
    row = r.json()["outputs"]["logits"][0]
    assert row[0] is None and row[1] is None and isinstance(row[2], float)


def test_busy_and_slow_answers_over_http(tmp_path):
    """503 + Retry-After when the queue is full, 504 when the answer takes too long (real HTTP, loopback)."""
    import concurrent.futures
    import threading

    import httpx

    from fixtures.live_server import live_server

    gate = threading.Event()
    gate.set()  # open for the start-up warm-up call
    runner = LinearRunner(gate=gate)
    app = create_app(
        linear_bundle(tmp_path), runner, ServeConfig(max_batch=1, max_wait_ms=0, max_queue=1, timeout_s=1.0)
    )
    _, b = body(1)
    with live_server(app) as (host, port):
        url = f"http://{host}:{port}/v1/predict"
        gate.clear()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futs = [pool.submit(httpx.post, url, content=b, headers=JSON, timeout=30) for _ in range(4)]
            codes = sorted(f.result().status_code for f in futs)
            busy = next(f.result() for f in futs if f.result().status_code == 503)
        gate.set()
        assert 503 in codes and 504 in codes, codes
        assert busy.headers["retry-after"] == "1" and "busy" in busy.json()["error"]
        assert httpx.post(url, content=b, headers=JSON, timeout=30).status_code == 200  # recovered

"""End to end: train the digits CNN, checkpoint it as DDP+compile would, export, serve, predict like eager."""

from __future__ import annotations

import concurrent.futures
import io
import json
import shutil
import socket
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.digits_model import load_digits_tensors, make_model, train
from fixtures.live_server import cli_server
from helpers import run_cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "digits_model.py"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    model = make_model()
    acc = train(model, epochs=1)
    assert acc > 0.5  # briefly trained: the point is real, non-random weights
    wrapped = {f"module._orig_mod.{k}": v for k, v in model.state_dict().items()}
    torch.save({"model": wrapped, "step": 99}, tmp / "ckpt.pt")
    r = run_cli(
        "export",
        "--model",
        f"{FIXTURE}:make_model",
        "--weights",
        str(tmp / "ckpt.pt"),
        "--example",
        "float32[1,1,8,8]",
        "--formats",
        "onnx,exported",
        "--max-batch",
        "32",
        "--output-names",
        "logits",
        "--out",
        str(tmp / "bundle"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parity passed" in r.stdout and "'module.' from 6 keys" in r.stdout
    return tmp, model


def post(port: int, body: bytes, ctype: str = "application/json") -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/predict", data=body, headers={"content-type": ctype}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


def test_served_predictions_match_eager(trained):
    tmp, model = trained
    x, _ = load_digits_tensors()
    x = x[:120]
    with torch.no_grad():
        want = model(x).numpy()
    with cli_server(
        str(tmp / "bundle"), "--max-batch", "16", "--max-wait-ms", "20", "--max-body", "64KiB"
    ) as (_, port):
        # Concurrent requests of different sizes: the server merges them and each gets its own rows back.
        slices, start = [], 0
        while start < len(x):
            n = 1 + len(slices) % 4
            slices.append((start, min(start + n, len(x))))
            start += n
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(
                    lambda s: post(port, json.dumps({"inputs": x[s[0] : s[1]].tolist()}).encode()), slices
                )
            )
        got = np.full_like(want, np.nan)
        for (a, b), (status, payload) in zip(slices, results, strict=True):
            assert status == 200, payload
            got[a:b] = payload["outputs"]["logits"]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
        assert (got.argmax(1) == want.argmax(1)).all()

        buf = io.BytesIO()
        np.save(buf, x[:5].numpy())
        status, payload = post(port, buf.getvalue(), "application/x-npy")
        assert status == 200
        np.testing.assert_allclose(payload["outputs"]["logits"], want[:5], atol=1e-4, rtol=1e-3)

        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        batches = float(
            next(ln.split()[-1] for ln in metrics.splitlines() if ln.startswith("scalpel_batches_total"))
        )
        assert 0 < batches < len(slices) + 1  # some requests were merged

        # 413 on a chunked body with no Content-Length: the server counts what actually arrives.
        head = (
            b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"a" * 32768
        body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4)) + b"0\r\n\r\n"
        assert raw(port, head + body).startswith(b"HTTP/1.1 413")
        # An honest Content-Length over the limit: 413 before reading.
        assert raw(
            port,
            b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 999999999\r\n\r\n",
        ).startswith(b"HTTP/1.1 413")
        # A Content-Length that understates the body: only the declared bytes are the body (422), the rest is rejected.
        lie = (
            b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n"
            + b"[" * 70000
        )
        reply = raw(port, lie)
        assert reply.startswith(b"HTTP/1.1 422")
        # Still healthy.
        assert post(port, json.dumps({"inputs": x[:1].tolist()}).encode())[0] == 200


def test_serve_refuses_unsafe_setups(trained, tmp_path):
    tmp, _ = trained
    r = run_cli("serve", str(tmp / "bundle"), "--host", "0.0.0.0", "--port", "0")
    assert r.returncode == 2 and "--token-file" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("serve", str(tmp / "bundle"), "--backend", "torch", "--port", "0")
    assert r.returncode == 2 and "--trust" in r.stderr
    copy = tmp_path / "tampered"
    shutil.copytree(tmp / "bundle", copy)
    with (copy / "model.onnx").open("ab") as fh:
        fh.write(b"\0")
    r = run_cli("serve", str(copy), "--port", "0")
    assert r.returncode == 1 and "model.onnx has changed" in r.stderr
    r = run_cli("serve", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "not a folder" in r.stderr


def test_token_server_with_torch_backend(trained, tmp_path):
    tmp, model = trained
    token = tmp_path / "token"
    token.write_text("s3cret-" + "x" * 20)
    token.chmod(0o600)
    x, _ = load_digits_tensors()
    body = json.dumps({"inputs": x[:3].tolist()}).encode()
    with cli_server(str(tmp / "bundle"), "--backend", "torch", "--trust", "--token-file", str(token)) as (
        _,
        port,
    ):
        assert post(port, body)[0] == 401
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/predict",
            data=body,
            headers={"content-type": "application/json", "authorization": f"Bearer {token.read_text()}"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            out = json.loads(r.read())["outputs"]["logits"]
    with torch.no_grad():
        np.testing.assert_allclose(out, model(x[:3]).numpy(), atol=1e-4, rtol=1e-3)


def test_export_parity_failure_exits_1_with_numbers(tmp_path):
    r = run_cli(
        "export",
        "--model",
        f"{FIXTURE}:make_noisy",
        "--example",
        "float32[2,4]",
        "--formats",
        "exported",
        "--out",
        str(tmp_path / "b"),
    )
    assert r.returncode == 1
    assert "FAIL" in r.stdout and "parity failed" in r.stdout and "max abs" in r.stdout
    assert (tmp_path / "b" / "manifest.json").exists()  # the figures are kept


def test_export_usage_error_is_one_line(tmp_path):
    r = run_cli(
        "export",
        "--model",
        f"{FIXTURE}:make_model",
        "--example",
        "float32[1,1,8,8]",
        "--weights",
        str(tmp_path / "missing.pt"),
        "--out",
        str(tmp_path / "b"),
    )
    assert (
        r.returncode == 2 and r.stderr.strip().startswith("scalpel: error:") and "Traceback" not in r.stderr
    )

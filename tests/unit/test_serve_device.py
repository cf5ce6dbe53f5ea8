"""`serve --device cuda` and the CUDA execution provider: the code path is the real one, and on a machine
without CUDA (CI) it is refused in one sentence before anything is read; never a CI dependency."""

from __future__ import annotations

import numpy as np
import pytest

from fixtures.serve_bundles import linear_bundle
from torchscalpel.cli.main import main
from torchscalpel.errors import UsageError
from torchscalpel.serve.backends import load_runner
from torchscalpel.ship.runners import CUDA_MISSING, cuda_provider_available, ort_providers, torch_device

ort_cuda = cuda_provider_available()


def _torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(ort_cuda, reason="onnxruntime has CUDA here: the refusal cannot happen")
def test_onnxruntime_cuda_is_refused_in_one_sentence(tmp_path):
    with pytest.raises(UsageError) as err:
        load_runner(linear_bundle(tmp_path), "onnxruntime", device="cuda")
    msg = str(err.value)
    assert msg.startswith(f"{CUDA_MISSING}: onnxruntime ") and "--device cpu" in msg and "\n" not in msg


@pytest.mark.skipif(_torch_cuda(), reason="torch sees a GPU here")
def test_torch_cuda_is_refused_in_one_sentence():
    with pytest.raises(UsageError, match=f"^{CUDA_MISSING}: torch .* sees no GPU"):
        torch_device("cuda")


@pytest.mark.skipif(ort_cuda, reason="onnxruntime has CUDA here")
def test_cli_refuses_before_reading_the_bundle(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "no-bundle"), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"scalpel: error: {CUDA_MISSING}") and "\n" not in err


def test_providers():
    assert ort_providers("cpu") == ["CPUExecutionProvider"]
    with pytest.raises(UsageError, match="--device takes cpu or cuda"):
        ort_providers("tpu")
    if ort_cuda:  # a lent GPU machine: the provider list carries TF32 off for fp32 parity
        assert ort_providers("cuda")[0] == ("CUDAExecutionProvider", {"use_tf32": "0"})


@pytest.mark.skipif(not ort_cuda, reason="needs onnxruntime's CUDA execution provider (GPU machines only)")
def test_cuda_runner_matches_cpu(tmp_path):  # pragma: no cover - GPU only
    from torchscalpel.ship.runners import OrtRunner

    onnx_path = tmp_path / "m.onnx"
    import torch

    torch.onnx.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),), str(onnx_path), dynamo=True)
    x = [np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)]
    cpu = OrtRunner(onnx_path)(x)[0]
    gpu = OrtRunner(onnx_path, name="onnx-cuda", device="cuda")(x)[0]
    np.testing.assert_allclose(gpu, cpu, atol=1e-5)

"""One calling convention for every form of the model: arrays in (manifest input order), arrays out.

Parity, latency and the server all go through these, so what parity checked is what serve runs.
Runners for ``.pt2`` and TorchScript files unpickle code; callers decide whether that is allowed
(export loads the files it has just written; serve requires ``--trust``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from torchscalpel.errors import ScalpelError, UsageError

DEVICES = ("cpu", "cuda")
CUDA_MISSING = "CUDA is not available here"
"""The start of every refusal of ``--device cuda`` on a machine without it (tests match it)."""
TRT_PROVIDER = "TensorrtExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
GPU_FORMS = (("onnx-cuda", CUDA_PROVIDER), ("onnx-trt", TRT_PROVIDER))
"""Extra ONNX rows export adds beside the CPU one, each only where onnxruntime has its provider."""


def ort_providers(device: str) -> list[Any]:
    """onnxruntime execution providers for ``device``; one sentence when CUDA's is not installed or usable.

    CUDA runs with TF32 off (``use_tf32=0``): parity against fp32 eager is the point, and TF32
    convolutions and matmuls differ from fp32 by ~1e-3 relative.
    """
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device != "cuda":
        raise UsageError(f"--device takes {' or '.join(DEVICES)}, not {device!r}.")
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise UsageError(
            f"{CUDA_MISSING}: onnxruntime {ort.__version__} has no CUDAExecutionProvider (install "
            "onnxruntime-gpu on a machine with an NVIDIA GPU), or serve with --device cpu."
        )
    return [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]


def gpu_forms(available: Sequence[str], version: str) -> tuple[list[str], dict[str, str]]:
    """Of :data:`GPU_FORMS`, the rows to add for onnxruntime's ``available`` providers, and for each row left
    out the reason (the manifest and the latency table say it, rather than leaving the row silently absent)."""
    rows: list[str] = []
    absent: dict[str, str] = {}
    for name, provider in GPU_FORMS:
        if provider in available:
            rows.append(name)
        else:
            absent[name] = f"onnxruntime {version} has no {provider}"
    return rows, absent


def provider_list(form: str) -> list[Any]:
    """onnxruntime providers of an export row: ``onnx-trt`` is TensorRT's with CUDA's and the CPU's behind it
    (TensorRT hands the nodes it cannot build to them), ``onnx-cuda`` is :func:`ort_providers` of cuda."""
    if form == "onnx-trt":
        return [
            (TRT_PROVIDER, {"trt_fp16_enable": "False"}),
            (CUDA_PROVIDER, {"use_tf32": "0"}),
            "CPUExecutionProvider",
        ]
    return ort_providers("cuda" if form == "onnx-cuda" else "cpu")


def cuda_provider_available() -> bool:
    """True when onnxruntime has the CUDA execution provider (export then adds ``onnx-cuda`` to parity and latency)."""
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def torch_device(device: str) -> str:
    """``device`` for the torch backend; one sentence when CUDA is asked for and torch cannot see a GPU."""
    if device not in DEVICES:
        raise UsageError(f"--device takes {' or '.join(DEVICES)}, not {device!r}.")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{CUDA_MISSING}: torch {torch.__version__} sees no GPU; serve with --device cpu.")
    return device


if TYPE_CHECKING:  # torch is imported lazily: serving an ONNX bundle never loads it
    import torch


class Runner(Protocol):
    """A callable model: one array per input, in order; returns one array per output."""

    name: str

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]: ...


def flatten_outputs(out: object) -> list[torch.Tensor]:
    """A model's return value as a list of tensors (a tensor, or a tuple/list of tensors)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    raise ScalpelError(
        f"The model returned {type(out).__name__}; export needs a tensor or a tuple of tensors as output."
    )


class TorchRunner:
    """Runs an ``nn.Module`` (eager, an ExportedProgram's module, or a TorchScript module)."""

    def __init__(self, module: torch.nn.Module, name: str, device: str = "cpu") -> None:
        self.module = module if device == "cpu" else module.to(device)
        self.name = name
        self.device = device

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        import torch

        with torch.inference_mode():
            tensors = [torch.from_numpy(np.ascontiguousarray(a)).to(self.device) for a in inputs]
            return [t.detach().cpu().numpy() for t in flatten_outputs(self.module(*tensors))]


def exported_runner(path: Path) -> TorchRunner:
    """Load a ``torch.export`` program (``.pt2``: unpickles, so only for trusted files)."""
    import logging

    import torch

    from torchscalpel.errors import ScalpelError

    log = logging.getLogger("torch.export")  # logs the whole traceback of a failed load at WARNING
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        program = torch.export.load(str(path))
    except Exception as exc:  # zipfile.BadZipFile, RuntimeError from the archive reader, pickle errors...
        raise ScalpelError(
            f"Cannot load {path} as a torch.export program ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); "
            "the file is damaged or not from torch.export: export the bundle again, or serve it with "
            "--backend onnxruntime."
        ) from None
    finally:
        log.setLevel(level)
    return TorchRunner(program.module(), "exported")


def torchscript_runner(path: Path) -> TorchRunner:
    """Load a TorchScript file (code: only for trusted files)."""
    import torch

    return TorchRunner(torch.jit.load(str(path), map_location="cpu").eval(), "torchscript")


class OrtRunner:
    """Runs an ONNX file in onnxruntime on the CPU execution provider (or CUDA's, with ``device="cuda"``)."""

    def __init__(
        self,
        path: Path,
        *,
        name: str = "onnx",
        threads: int = 0,
        device: str = "cpu",
        providers: list[Any] | None = None,
    ) -> None:
        import onnxruntime as ort

        providers = providers if providers is not None else ort_providers(device)
        options = ort.SessionOptions()
        # 0 lets onnxruntime pick; benchmarks pin 1 so runs on shared cores compare fairly.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        # Spinning worker threads would steal the cores eager torch and the HTTP loop need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise ScalpelError(f"onnxruntime cannot load {path} ({str(exc).splitlines()[0]}).") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.name = name

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        feed = {n: np.ascontiguousarray(a) for n, a in zip(self.input_names, inputs, strict=True)}
        return list(self.session.run(None, feed))

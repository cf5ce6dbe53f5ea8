"""Pick and load the model runner for a verified bundle.

``onnxruntime`` runs ``model.onnx`` (or ``model.int8.onnx`` with ``quantized``): ONNX files are
data, not code, so no trust flag is needed. ``torch`` runs the ``torch.export`` program
(``model.pt2``) or, failing that, the TorchScript file; both unpickle code and load only with
``trust=True``.
"""

from __future__ import annotations

from torchscalpel.errors import UsageError
from torchscalpel.ship.bundle import Bundle
from torchscalpel.ship.runners import OrtRunner, Runner, exported_runner, torchscript_runner

BACKENDS = ("onnxruntime", "torch")


def load_runner(bundle: Bundle, backend: str, *, trust: bool = False, quantized: bool = False, threads: int = 0) -> Runner:
    """The runner for ``backend``; raises :class:`UsageError` naming the flag to change."""
    if backend == "onnxruntime":
        kind = "onnx_int8" if quantized else "onnx"
        path = bundle.file(kind)
        if path is None:
            hint = "export with --quantize int8-dynamic" if quantized else "export with --formats onnx, or use --backend torch"
            raise UsageError(f"Bundle {bundle.path} has no {kind} file; {hint}.")
        return OrtRunner(path, name=kind, threads=threads)
    if backend == "torch":
        if quantized:
            raise UsageError("--quantized serves the int8 ONNX model; use it with --backend onnxruntime.")
        kind = "exported" if bundle.file("exported") else "torchscript" if bundle.file("torchscript") else None
        if kind is None:
            raise UsageError(f"Bundle {bundle.path} has no .pt2 or TorchScript file for --backend torch.")
        if not trust:
            raise UsageError(
                f"--backend torch loads {bundle.file(kind).name}, which unpickles code; pass --trust if you made this "
                "bundle yourself, or use --backend onnxruntime."
            )
        if threads:
            import torch

            torch.set_num_threads(threads)
        path = bundle.file(kind)
        assert path is not None
        return exported_runner(path) if kind == "exported" else torchscript_runner(path)
    raise UsageError(f"--backend takes {' or '.join(BACKENDS)}, not {backend!r}.")

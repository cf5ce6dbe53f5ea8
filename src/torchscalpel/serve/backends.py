"""Pick and load the model runner for a verified bundle.

``onnxruntime`` runs ``model.onnx`` (or ``model.int8.onnx`` with ``quantized``): ONNX files are
data, not code, so no trust flag is needed. ``torch`` runs the ``torch.export`` program
(``model.pt2``) or, failing that, the TorchScript file; both unpickle code and load only with
``trust=True``.
"""

from __future__ import annotations

from torchscalpel.errors import UsageError
from torchscalpel.ship.bundle import Bundle
from torchscalpel.ship.runners import (
    OrtRunner,
    Runner,
    TorchRunner,
    exported_runner,
    ort_providers,
    torch_device,
    torchscript_runner,
)

BACKENDS = ("onnxruntime", "torch")


def load_runner(
    bundle: Bundle,
    backend: str,
    *,
    trust: bool = False,
    quantized: bool = False,
    threads: int = 0,
    device: str = "cpu",
) -> Runner:
    """The runner for ``backend`` on ``device``; raises :class:`UsageError` naming the flag to change
    (``--device cuda`` where there is no CUDA: "CUDA is not available here: ...")."""
    if backend == "onnxruntime":
        ort_providers(device)  # before the file: the device is the first thing to refuse
        kind = "onnx_int8" if quantized else "onnx"
        path = bundle.file(kind)
        if path is None:
            hint = (
                "export with --quantize int8-dynamic"
                if quantized
                else "export with --formats onnx, or use --backend torch"
            )
            raise UsageError(f"Bundle {bundle.path} has no {kind} file; {hint}.")
        return OrtRunner(path, name=kind, threads=threads, device=device)
    if backend == "torch":
        if quantized:
            raise UsageError("--quantized serves the int8 ONNX model; use it with --backend onnxruntime.")
        torch_device(device)
        kind = "exported" if bundle.file("exported") else "torchscript"
        path = bundle.file(kind)
        if path is None:
            raise UsageError(f"Bundle {bundle.path} has no .pt2 or TorchScript file for --backend torch.")
        if not trust:
            raise UsageError(
                f"--backend torch loads {path.name}, which unpickles code; pass --trust if you made this "
                "bundle yourself, or use --backend onnxruntime."
            )
        if threads:
            import torch

            torch.set_num_threads(threads)
        runner = exported_runner(path) if kind == "exported" else torchscript_runner(path)
        if device != "cpu":
            runner = TorchRunner(runner.module, f"{runner.name}-{device}", device)
        return runner
    raise UsageError(f"--backend takes {' or '.join(BACKENDS)}, not {backend!r}.")


def check_runner(bundle: Bundle, runner: Runner) -> None:
    """Run the model once on the manifest's inputs; refuse (one sentence) a model the manifest does not describe.

    A manifest edited to name more (or fewer) outputs than the model returns, or inputs the model
    does not take, would otherwise start a server that answers 500 to every request.
    """
    import numpy as np

    from torchscalpel.serve.codec import InputSpec
    from torchscalpel.ship.bundle import axis_bounds

    specs = bundle.inputs
    static = specs[0]["shape"][0] is not None
    rows = bundle.max_batch if static else 1
    axes = axis_bounds(bundle.manifest)
    warm = []
    for s in specs:
        low = (s.get("range") or [0])[0]
        warm.append(
            np.full(InputSpec.from_manifest(s, axes).warm_shape(rows), low, dtype=np.dtype(s["dtype"]))
        )
    try:
        outputs = runner(warm)
    except Exception as exc:  # any runtime's own error types: the model rejected the manifest's inputs
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise UsageError(
            f"The model in {bundle.path} does not take the inputs its manifest describes ({first}); "
            "re-run 'scalpel export'."
        ) from None
    declared = bundle.outputs
    if len(outputs) != len(declared):
        raise UsageError(
            f"The manifest of {bundle.path} names {len(declared)} outputs but the model returns "
            f"{len(outputs)}; re-run 'scalpel export'."
        )
    for spec, out in zip(declared, outputs, strict=True):
        shape = getattr(out, "shape", ())
        want = spec["shape"]
        if len(shape) != len(want) or any(
            w is not None and w != g for w, g in zip(want[1:], shape[1:], strict=False)
        ):
            raise UsageError(
                f"Output {spec['name'][:60]!r} of {bundle.path} has shape {tuple(shape)} but the manifest "
                f"says {want}; re-run 'scalpel export'."
            )

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
    precision: str | None = None,
    compile: bool = False,
) -> Runner:
    """The runner for ``backend`` on ``device``; raises :class:`UsageError` naming the flag to change
    (``--device cuda`` where there is no CUDA: "CUDA is not available here: ...").

    ``precision`` picks a reduced-precision form export kept (``fp16``: ONNX, ``bf16``: the torch
    program); ``compile`` puts the torch program under ``torch.compile`` (warm it with :func:`warm_compiled`).
    """
    if compile and backend != "torch":
        raise UsageError("--compile compiles the torch program; use it with --backend torch --trust.")
    if precision is not None and (quantized or precision not in ("fp16", "bf16")):
        raise UsageError("--precision takes fp16 or bf16, and not with --quantized.")
    if precision is not None:
        want = "onnxruntime" if precision == "fp16" else "torch"
        if backend != want:
            raise UsageError(
                f"--precision {precision} serves the {'fp16 ONNX model' if want == 'onnxruntime' else 'bf16 torch program'}"
                f"; use it with --backend {want}."
            )
    if backend == "onnxruntime":
        ort_providers(device)  # before the file: the device is the first thing to refuse
        kind = "onnx_fp16" if precision == "fp16" else "onnx_int8" if quantized else "onnx"
        path = bundle.file(kind)
        if path is None:
            hint = (
                "export with --precision fp16 (it is kept only where its parity holds)"
                if precision
                else "export with --quantize int8-dynamic"
                if quantized
                else "export with --formats onnx, or use --backend torch"
            )
            raise UsageError(f"Bundle {bundle.path} has no {kind} file; {hint}.")
        return OrtRunner(path, name=kind, threads=threads, device=device)
    if backend == "torch":
        if quantized:
            raise UsageError("--quantized serves the int8 ONNX model; use it with --backend onnxruntime.")
        torch_device(device)
        kind = (
            "exported_bf16"
            if precision == "bf16"
            else "exported"
            if bundle.file("exported")
            else "torchscript"
        )
        path = bundle.file(kind)
        if path is None:
            if precision:
                raise UsageError(
                    f"Bundle {bundle.path} has no bf16 program; export with --precision bf16 (it is kept only "
                    "where its parity holds)."
                )
            raise UsageError(f"Bundle {bundle.path} has no .pt2 or TorchScript file for --backend torch.")
        if not trust:
            raise UsageError(
                f"--backend torch loads {path.name}, which unpickles code; pass --trust if you made this "
                "bundle yourself, or use --backend onnxruntime."
            )
        if threads:
            import torch

            torch.set_num_threads(threads)
        if kind == "exported_bf16":
            from torchscalpel.ship.precision import load_bf16_program

            runner: TorchRunner = load_bf16_program(path)
            if device != "cpu":
                runner.module, runner.device = runner.module.to(device), device
        else:
            runner = exported_runner(path) if kind == "exported" else torchscript_runner(path)
            if device != "cpu":
                runner = TorchRunner(runner.module, f"{runner.name}-{device}", device)
        if compile:
            from torchscalpel.ship.precision import compiled

            runner = compiled(runner)
        return runner
    raise UsageError(f"--backend takes {' or '.join(BACKENDS)}, not {backend!r}.")


def warm_compiled(bundle: Bundle, runner: Runner, max_batch: int) -> list[int]:
    """Call a compiled runner at batch 1 and at ``max_batch`` (the example's other sizes) before serving, so
    compilation and the one recompile for a dynamic batch happen now, not in a client's request. Returns
    the batches called."""
    import numpy as np

    from torchscalpel.serve.codec import InputSpec
    from torchscalpel.ship.bundle import axis_bounds

    axes = axis_bounds(bundle.manifest)
    specs = [InputSpec.from_manifest(s, axes) for s in bundle.inputs]
    static = specs[0].shape[0] is not None
    rows = [bundle.max_batch] if static else sorted({1, min(max_batch, bundle.max_batch)})
    for n in rows:
        runner([np.full(s.warm_shape(n), s.low or 0, dtype=s.dtype) for s in specs])
    return rows


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

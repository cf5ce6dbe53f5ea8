"""Reduced-precision forms (fp16 ONNX, bf16 torch program) and compiled inference, beside the fp32 peer.

``fp16`` converts the fp32 ONNX export with onnxruntime's own float16 converter
(``onnxruntime.transformers.float16``), inputs and outputs kept float32 so clients and serve send the
same arrays. ``bf16`` exports the model cast to bfloat16 with ``torch.export`` (onnxruntime has few
bf16 kernels on CPU); its runner casts float inputs to bf16 and outputs back to float32.

Each form is compared with fp32 eager at every parity batch under its dtype's stated tolerance
(``parity.TOLERANCES``) and timed in the same latency table as fp32; it stays in the bundle only
where parity holds, and the manifest says why either way.

``compiled`` wraps a torch runner's module in ``torch.compile`` (the ``pt2+compile`` row, and
``serve --compile``); :func:`warm_up` calls it at the shapes it will serve so compilation happens
before the first request, not during it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from torchscalpel.errors import ScalpelError
from torchscalpel.ship.parity import TOLERANCES
from torchscalpel.ship.runners import TorchRunner, flatten_outputs

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp16", "bf16")
FILES = {"fp16": "model.fp16.onnx", "bf16": "model.bf16.pt2"}
"""Precision -> file name inside the bundle (artifact kinds ``onnx_fp16``, ``exported_bf16``)."""
ARTIFACT = {"fp16": "onnx_fp16", "bf16": "exported_bf16"}
FORM = {"fp16": "onnx-fp16", "bf16": "pt2-bf16"}
"""Precision -> its row in the parity and latency tables."""
DTYPE_NAME = {"fp16": "float16", "bf16": "bfloat16"}


def tolerance(precision: str) -> tuple[float, float]:
    """The stated (atol, rtol) a reduced-precision form must meet against fp32 eager."""
    return TOLERANCES[DTYPE_NAME[precision]]


def parse_precisions(text: str | None) -> tuple[str, ...]:
    """``--precision fp16,bf16`` as a tuple; one sentence on anything else."""
    if not text:
        return ()
    items = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in items if p not in PRECISIONS]
    if bad or not items:
        raise ValueError(f"--precision takes a comma list of {', '.join(PRECISIONS)}, not {text!r}")
    return tuple(dict.fromkeys(items))


def write_fp16_onnx(src: Path, dst: Path) -> None:
    """An fp16 copy of the fp32 ONNX file (float32 inputs and outputs kept), by onnxruntime's converter."""
    import onnx

    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError:
        raise ScalpelError(
            "fp16 needs onnxruntime's float16 converter (onnxruntime.transformers), which this onnxruntime lacks; "
            "drop fp16 from --precision."
        ) from None
    model = onnx.load(str(src))
    try:
        half = convert_float_to_float16(model, keep_io_types=True)
    except Exception as exc:  # the converter's own errors (shape inference, unsupported initialisers)
        raise ScalpelError(
            f"Converting the ONNX export to fp16 failed ({str(exc).splitlines()[0][:200]})."
        ) from None
    onnx.save(half, str(dst))


class CastRunner(TorchRunner):
    """A torch module run in ``dtype``: float inputs cast to it, float outputs cast back to float32."""

    def __init__(self, module: torch.nn.Module, name: str, dtype: torch.dtype) -> None:
        super().__init__(module, name)
        self.dtype = dtype

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        import torch

        with torch.inference_mode():
            tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
            tensors = [t.to(self.dtype) if t.is_floating_point() else t for t in tensors]
            outs = flatten_outputs(self.module(*tensors))
            return [(t.float() if t.is_floating_point() else t).detach().cpu().numpy() for t in outs]


def write_bf16_program(model: torch.nn.Module, args: tuple[torch.Tensor, ...], dyn: Any, dst: Path) -> None:
    """``torch.export`` of a bfloat16 copy of ``model`` (the fp32 model is left as it is)."""
    import torch

    half = copy.deepcopy(model).to(torch.bfloat16)
    half_args = tuple(a.to(torch.bfloat16) if a.is_floating_point() else a for a in args)
    program = torch.export.export(half, half_args, dynamic_shapes=dyn)
    torch.export.save(program, str(dst))


def load_bf16_program(path: Path, name: str = FORM["bf16"]) -> CastRunner:
    """The bf16 program (``.pt2``: unpickles, trusted files only) as a runner taking float32 arrays."""
    import torch

    from torchscalpel.ship.runners import exported_runner

    return CastRunner(exported_runner(path).module, name, torch.bfloat16)


def compiled(runner: TorchRunner, name: str | None = None, *, backend: str = "inductor") -> TorchRunner:
    """The same runner with its module under ``torch.compile`` (inductor, which builds C++ kernels with the
    system compiler; tests that may not start a process pass ``aot_eager``)."""
    import torch

    out = copy.copy(runner)
    out.module = torch.compile(runner.module, backend=backend)  # type: ignore[assignment]
    out.name = name or f"{runner.name}+compile"
    return out


def warm_up(runner: Any, batches: Sequence[Sequence[np.ndarray]]) -> None:
    """Call ``runner`` once per batch shape: compilation (and each recompile for a new shape) happens here."""
    for batch in batches:
        runner(batch)

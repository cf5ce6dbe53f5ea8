"""Optional int8 dynamic quantization of the ONNX export, with its measured cost and gain.

Choice: onnxruntime's ``quantize_dynamic`` (int8 weights, activations quantized per call). It
ships with onnxruntime, which serve already uses, so it adds no dependency, and its output is a
plain ONNX file that ``scalpel serve`` runs like the fp32 one. ``torch.ao.quantization.quantize_dynamic``
is deprecated and cannot be exported; torchao is faster in eager torch but is not installed here
and its models still need a torch runtime to serve.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from torchscalpel.errors import ScalpelError
from torchscalpel.ship.latency import measure_latency
from torchscalpel.ship.runners import OrtRunner, Runner

METHODS = ("int8-dynamic", "int8-static")
CALIBRATION_ROWS = 8
"""Rows per calibration call (quantize_static reads the calibration set batch by batch)."""


@dataclass(kw_only=True, slots=True)
class QuantReport:
    """What int8 costs (error vs eager, top-1 agreement) and gains (speed vs the fp32 ONNX)."""

    method: str
    file: str
    max_abs_error: float
    top1_agreement: float | None
    """Share of rows whose argmax over the last axis matches eager (first output, 2-D outputs only)."""
    latency_ms_fp32: float
    latency_ms_int8: float
    speedup: float
    batch: int
    parity_passed: bool | None = None
    """Every int8 output within the int8 tolerance of eager (static quantization's keep rule)."""
    speedups: dict[str, float] | None = None
    """Batch -> fp32 ONNX ms / int8 ms from the latency table (static quantization's keep rule)."""
    kept: bool = True
    """Whether ``file`` is in the bundle: static int8 is kept only when faster at every timed batch and within
    tolerance."""
    reason: str = ""
    calibration: str = ""
    """Where the calibration samples came from."""

    def to_dict(self) -> dict[str, object]:
        """JSON form for the manifest."""
        return asdict(self)


def quantize_onnx(src: Path, dst: Path) -> None:
    """Write an int8 dynamically quantized copy of ``src`` to ``dst`` (one self-contained file)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # onnxruntime logs a pre-processing hint through the root logger on every call; it is noise here.
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(None), tempfile.TemporaryDirectory() as scratch:
            # Linear layers only: measured here, ConvInteger runs ~7x slower than fp32 Conv in onnxruntime's
            # CPU provider, while MatMulInteger runs a 1024-wide MLP 2.4x (batch 1) to 3.7x (batch 32) faster.
            quantize_dynamic(
                str(_without_value_info(src, Path(scratch))),
                str(dst),
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Gemm"],
            )
    except Exception as exc:  # onnxruntime raises many types for unsupported graphs
        raise ScalpelError(f"int8 quantization of {src.name} failed ({str(exc).splitlines()[0]}).") from None
    finally:
        logger.setLevel(level)


def quantize_static_onnx(
    src: Path, dst: Path, calibration: list[list[np.ndarray]], input_names: list[str]
) -> None:
    """Write a statically quantized copy of ``src`` (int8 weights per channel, uint8 activations, QDQ format)
    whose activation ranges come from running ``calibration`` (batches, one array per input) through it.

    Convolutions are where static quantization pays: measured here on a 3-conv net (1 thread), QDQ
    int8 ran 1.9x (batch 1) and 2.2x (batch 32) the fp32 ONNX model, where dynamic int8 ran conv nets
    slower (ConvInteger). ``quant_pre_process`` (shape inference + graph optimisation) runs first, as
    onnxruntime recommends; the model is made one self-contained file before (the exporter writes its
    weights beside it in ``model.onnx.data``, which the pre-processor cannot follow into a scratch folder).
    """
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([dict(zip(input_names, b, strict=True)) for b in calibration])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(None), tempfile.TemporaryDirectory() as scratch:
            model = onnx.load(str(src))
            del model.graph.value_info[:]
            single = Path(scratch) / "single.onnx"
            onnx.save(model, str(single))
            prepared = Path(scratch) / "prepared.onnx"
            try:
                quant_pre_process(str(single), str(prepared), skip_symbolic_shape=True)
            except Exception:  # the pre-processor is an optimisation; quantize the plain copy without it
                prepared = single
            quantize_static(
                str(prepared),
                str(dst),
                Reader(),
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                per_channel=True,
            )
    except Exception as exc:  # onnxruntime raises many types for unsupported graphs
        raise ScalpelError(
            f"int8 static quantization of {src.name} failed ({str(exc).splitlines()[0]})."
        ) from None
    finally:
        logger.setLevel(level)


def calibration_batches(rows: list[np.ndarray]) -> list[list[np.ndarray]]:
    """One input per array, first dim the samples -> calibration batches of ``CALIBRATION_ROWS`` rows."""
    total = rows[0].shape[0]
    return [[r[i : i + CALIBRATION_ROWS] for r in rows] for i in range(0, total, CALIBRATION_ROWS)]


def _without_value_info(src: Path, scratch: Path) -> Path:
    """A copy of ``src`` without its intermediate shape annotations (``graph.value_info``).

    The exporter annotates intermediates with the shapes of its example batch; onnxruntime before
    1.32 re-infers them during quantization and refuses the model when the two disagree
    ("Inferred shape and existing shape differ", seen with 1.23). The annotations are optional; the
    quantizer infers its own.
    """
    import onnx

    model = onnx.load(str(src))
    if not len(model.graph.value_info):
        return src
    del model.graph.value_info[:]
    out = scratch / src.name
    onnx.save(model, str(out))
    return out


def evaluate(
    eager: Runner,
    fp32: Runner,
    int8: OrtRunner,
    batches: dict[int, list[np.ndarray]],
    method: str,
    file: str,
) -> QuantReport:
    """Compare the int8 model with eager on the parity batches and time it against fp32 ONNX."""
    max_abs, agree, rows = 0.0, 0, 0
    for inputs in batches.values():
        want, got = eager(inputs), int8(inputs)
        for w, g in zip(want, got, strict=True):
            max_abs = max(max_abs, float(np.max(np.abs(w.astype(np.float64) - g.astype(np.float64)))))
        if want[0].ndim == 2 and want[0].shape[1] > 1:
            agree += int(np.sum(np.argmax(want[0], -1) == np.argmax(got[0], -1)))
            rows += want[0].shape[0]
    biggest = max(batches)
    timing = measure_latency([fp32, int8], batches[biggest])
    return QuantReport(
        method=method,
        file=file,
        max_abs_error=max_abs,
        top1_agreement=(agree / rows) if rows else None,
        latency_ms_fp32=timing[fp32.name],
        latency_ms_int8=timing[int8.name],
        speedup=round(timing[fp32.name] / max(timing[int8.name], 1e-9), 3),
        batch=biggest,
    )

"""Backend-flag knobs: float32 matmul precision (TF32 on CUDA) and cudnn.benchmark."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from torchscalpel.tune.knobs.base import CLOSE, EXACT, ApplyLog, Knob, SetupHook, Undo
from torchscalpel.tune.settings import TuneSettings

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts


class MatmulPrecisionKnob(Knob):
    """``torch.set_float32_matmul_precision``: ``high`` lets float32 matmuls use TF32 on Ampere+ GPUs."""

    name = "matmul"
    numerics = CLOSE
    description = "float32 matmul precision (TF32 on CUDA)"

    def is_set(self, settings: TuneSettings) -> bool:
        return settings.matmul_precision is not None

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        if facts.device != "cuda":
            # On CPU "high" changes nothing for float32 GEMMs on most builds: not worth a trial.
            return [], "TF32 matmuls exist only on CUDA GPUs"
        return [TuneSettings(matmul_precision="high")], None

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        value = settings.matmul_precision
        if value is None:
            return None

        def hook() -> Undo:
            before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision(value)
            log.did(self.name, f"float32 matmul precision {before} -> {value}")
            return lambda: torch.set_float32_matmul_precision(before)

        return hook

    def code_lines(self, settings: TuneSettings) -> list[str]:
        if settings.matmul_precision is None:
            return []
        return [f'torch.set_float32_matmul_precision("{settings.matmul_precision}")']


class CudnnBenchmarkKnob(Knob):
    """``torch.backends.cudnn.benchmark``: autotune conv algorithms (pays off with static shapes)."""

    name = "cudnn"
    numerics = EXACT
    description = "cudnn.benchmark (CUDA conv nets with static shapes)"

    def is_set(self, settings: TuneSettings) -> bool:
        return settings.cudnn_benchmark is not None

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        if facts.device != "cuda":
            return [], "cudnn exists only on CUDA GPUs"
        if not facts.has_conv:
            return [], "the model has no Conv2d layers"
        if facts.input_shapes_vary:
            return [], "input shapes vary, so cudnn would re-benchmark on every new shape"
        return [TuneSettings(cudnn_benchmark=True)], None

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        value = settings.cudnn_benchmark
        if value is None:
            return None

        def hook() -> Undo:
            before = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = value
            log.did(self.name, f"cudnn.benchmark={value}")

            def undo() -> None:
                torch.backends.cudnn.benchmark = before

            return undo

        return hook

    def code_lines(self, settings: TuneSettings) -> list[str]:
        if settings.cudnn_benchmark is None:
            return []
        return [f"torch.backends.cudnn.benchmark = {settings.cudnn_benchmark}"]

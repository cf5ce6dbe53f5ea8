"""``--precision`` is one enum, checked once where simulation settings are built."""

from __future__ import annotations

import json

import pytest
from torch import nn

from torchscalpel.errors import UsageError
from torchscalpel.plan.names import PRECISIONS, Precision
from torchscalpel.plan.simulate import OptimizerSpec, SimSettings, build_meta_model, simulate
from torchscalpel.plan.spec import parse_batch_spec


def test_the_names_are_the_enum_values_and_print_as_themselves():
    assert PRECISIONS == ("fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp64")
    assert Precision.parse("fp16-mixed") is Precision.FP16_MIXED == "fp16-mixed"
    assert f"{Precision.BF16_MIXED}" == "bf16-mixed" and json.dumps(Precision.BF16) == '"bf16"'
    assert {"bf16-mixed": 1}.get(Precision.BF16_MIXED) == 1  # a str key still finds it (plan_measure)


def test_settings_take_a_name_and_check_it_once():
    settings = SimSettings(optimizer=OptimizerSpec.named("sgd"), precision="bf16")
    assert settings.precision is Precision.BF16
    assert SimSettings(optimizer=OptimizerSpec.named("sgd")).precision is Precision.FP32
    with pytest.raises(UsageError, match="--precision"):
        SimSettings(optimizer=OptimizerSpec.named("sgd"), precision="fp8")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.b(self.a(x).relu())


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_simulates_and_bf16_halves_the_parameters(precision):
    spec = parse_batch_spec("x=float32[8,32],y=int64[8]:4")
    settings = SimSettings(optimizer=OptimizerSpec.named("adamw"), precision=precision)
    m = simulate(lambda: build_meta_model(_Net, precision), spec, settings)
    fp32_bytes = 4 * sum(p.numel() for p in _Net().parameters())
    assert m.param_bytes == {"bf16": fp32_bytes // 2, "fp64": 2 * fp32_bytes}.get(precision, fp32_bytes)
    assert m.peak_bytes > m.param_bytes

"""The fake-tensor allocation tracker and the step simulation: exact bytes where they are knowable."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from plan_measure import profiled_peak, train_steps
from torchscalpel.errors import UsageError
from torchscalpel.plan.simulate import OptimizerSpec, SimSettings, build_meta_model, simulate
from torchscalpel.plan.spec import parse_batch_spec
from torchscalpel.plan.tracker import SimulationTracker


def test_views_and_inplace_ops_count_once_and_frees_are_seen():
    tracker = SimulationTracker()
    with FakeTensorMode(), tracker:
        a = torch.empty(1000)  # 4000 bytes
        v = a.view(10, 100)
        v.add_(1)
        b = a * 2  # a new storage
        assert tracker.live_bytes() == 8000
        del b
        assert tracker.live_bytes() == 4000
        del a, v
    assert tracker.live_bytes() == 0
    assert int(tracker.timeline().total().max()) == 8000


def _linear():
    return nn.Linear(256, 128)


def test_linear_adamw_states_are_exact():
    m = simulate(
        lambda: build_meta_model(_linear, "fp32"),
        parse_batch_spec("x=float32[16,256]"),
        SimSettings(optimizer=OptimizerSpec.named("adamw")),
    )
    params = (256 * 128 + 128) * 4
    assert m.param_bytes == params
    assert m.grad_bytes == params
    # exp_avg + exp_avg_sq, plus one 4-byte step tensor per parameter
    assert m.optim_bytes == 2 * params + 2 * 4
    assert m.input_bytes == 16 * 256 * 4
    # the input is saved for the weight gradient but is labelled input, the weight is a parameter:
    # neither counts as an activation saved for backward
    assert m.saved_bytes == 0


def test_sgd_has_no_state_and_bf16_halves_the_weights():
    sgd = simulate(
        lambda: build_meta_model(_linear, "fp32"),
        parse_batch_spec("x=float32[16,256]"),
        SimSettings(optimizer=OptimizerSpec.named("sgd")),
    )
    assert sgd.optim_bytes == 0
    half = simulate(
        lambda: build_meta_model(_linear, "bf16"),
        parse_batch_spec("x=float32[16,256]"),
        SimSettings(optimizer=OptimizerSpec.named("sgd"), precision="bf16"),
    )
    assert half.param_bytes * 2 == sgd.param_bytes


class _Deep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(6)]
        )
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def test_block_checkpointing_lowers_the_activation_peak():
    spec = parse_batch_spec("x=float32[512,64],y=int64[512]:10")
    plain = simulate(
        lambda: build_meta_model(_Deep, "fp32"), spec, SimSettings(optimizer=OptimizerSpec.named("sgd"))
    )
    ckpt = simulate(
        lambda: build_meta_model(_Deep, "fp32"),
        spec,
        SimSettings(optimizer=OptimizerSpec.named("sgd"), checkpoint_blocks=True),
    )
    assert [n for n, _ in plain.blocks] == [f"layers.{i}" for i in range(6)]
    assert ckpt.act_peak_bytes < 0.6 * plain.act_peak_bytes
    assert plain.saved_bytes > 6 * 512 * 256 * 4  # each block saves at least its hidden activations


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_plan_matches_the_profiled_peak_of_real_steps(precision):
    spec = parse_batch_spec("x=float32[256,64],y=int64[256]:10")
    settings = SimSettings(optimizer=OptimizerSpec.named("adamw"), precision=precision)
    planned = simulate(lambda: build_meta_model(_Deep, precision), spec, settings)
    measured = profiled_peak(lambda: train_steps(_Deep(), spec, settings))
    assert abs(planned.peak_bytes / measured - 1) < 0.05, (planned.peak_bytes, measured)


def test_grad_accumulation_keeps_gradients_alive_through_the_second_forward():
    spec = parse_batch_spec("x=float32[512,64],y=int64[512]:10")
    one = simulate(
        lambda: build_meta_model(_Deep, "fp32"), spec, SimSettings(optimizer=OptimizerSpec.named("sgd"))
    )
    two = simulate(
        lambda: build_meta_model(_Deep, "fp32"),
        spec,
        SimSettings(optimizer=OptimizerSpec.named("sgd"), grad_accum=2),
    )
    fwd = two.timeline.in_phases(("forward",))
    assert int(two.timeline.bytes["gradients"][fwd].max()) == two.grad_bytes
    assert int(one.timeline.bytes["gradients"][one.timeline.in_phases(("forward",))].max()) == 0


class _NeedsData(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x[x > 0].view(-1, 4))  # boolean indexing: output shape depends on values


def test_a_model_that_needs_real_data_names_the_op():
    with pytest.raises(UsageError, match=r"fake tensors.*aten\.\w+"):
        simulate(
            lambda: build_meta_model(_NeedsData, "fp32"),
            parse_batch_spec("x=float32[8,4]"),
            SimSettings(optimizer=OptimizerSpec.named("sgd")),
        )


def test_factory_errors_and_non_modules_are_usage_errors():
    def broken():
        raise ValueError("bad width")

    with pytest.raises(UsageError, match="bad width"):
        build_meta_model(broken, "fp32")
    with pytest.raises(UsageError, match=r"not a torch\.nn\.Module"):
        build_meta_model(lambda: 3, "fp32")


class _LSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(32, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def test_lstm_workspace_is_probed_to_its_real_size(monkeypatch):
    """oneDNN's RNN workspace is 0 bytes on fake tensors; the probe brings the plan close to real steps."""
    from torchscalpel.plan import tracker as tracker_module

    spec = parse_batch_spec("x=float32[16,48,32],y=int64[16]:10")
    settings = SimSettings(optimizer=OptimizerSpec.named("sgd"))
    planned = simulate(lambda: build_meta_model(_LSTM, "fp32"), spec, settings)
    measured = profiled_peak(lambda: train_steps(_LSTM(), spec, settings))
    # within 15 %: the rest is oneDNN scratchpad that no output carries
    assert abs(planned.peak_bytes / measured - 1) < 0.15, (planned.peak_bytes, measured)
    monkeypatch.setattr(tracker_module, "PROBED_OPS", frozenset())
    unprobed = simulate(lambda: build_meta_model(_LSTM, "fp32"), spec, settings)
    assert unprobed.peak_bytes < 0.5 * measured


def test_large_probes_scale_the_last_real_probe_instead_of_allocating(monkeypatch):
    from torchscalpel.plan import tracker as tracker_module

    spec = parse_batch_spec("x=float32[16,48,32],y=int64[16]:10")
    settings = SimSettings(optimizer=OptimizerSpec.named("sgd"))
    real_probe = simulate(lambda: build_meta_model(_LSTM, "fp32"), spec.with_batch(64), settings)
    simulate(
        lambda: build_meta_model(_LSTM, "fp32"), spec, settings
    )  # a real probe at batch 16 sets the ratio
    monkeypatch.setattr(tracker_module, "PROBE_LIMIT", 0)  # every later probe "too big": ratio only
    monkeypatch.setattr(tracker_module, "_PROBE_CACHE", {})
    big = simulate(lambda: build_meta_model(_LSTM, "fp32"), spec.with_batch(64), settings)
    monkeypatch.setattr(tracker_module, "PROBED_OPS", frozenset())
    unprobed = simulate(lambda: build_meta_model(_LSTM, "fp32"), spec.with_batch(64), settings)
    # scaling the batch-16 probe lands near the real batch-64 probe, far above no probe at all
    assert abs(big.peak_bytes / real_probe.peak_bytes - 1) < 0.25, (big.peak_bytes, real_probe.peak_bytes)
    assert big.peak_bytes > 1.5 * unprobed.peak_bytes

"""fp16 autocast with a GradScaler inserted into an unmodified loop: loss scaled in backward,
gradients unscaled before clipping and the step, steps with inf gradients skipped (run on CPU,
where autocast fp16 and GradScaler('cpu') exist; tune only offers fp16 on pre-Ampere GPUs)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from torchscalpel.tune.apply import applied
from torchscalpel.tune.facts import ModelFacts
from torchscalpel.tune.knobs.amp import AmpKnob
from torchscalpel.tune.settings import TuneSettings


def loop_step(model, opt, x, y, scale_loss: float = 1.0) -> float:
    """One step as the script wrote it (float32, no scaler); returns the clipped norm."""
    loss = nn.functional.mse_loss(model(x).float(), y) * scale_loss
    opt.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    opt.step()
    return float(norm)


def setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    return model, x, y


def test_clipping_sees_unscaled_gradients_and_the_step_runs():
    model, x, y = setup()
    ref = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    ref.load_state_dict(model.state_dict())
    ref_norm = loop_step(ref, torch.optim.SGD(ref.parameters(), lr=0.1), x, y)
    with applied(TuneSettings(amp="fp16")) as log:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = [p.detach().clone() for p in model.parameters()]
        norm = loop_step(model, opt, x, y)
    assert norm == pytest.approx(ref_norm, rel=2e-2)  # scaled grads would be 65536x larger
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert "loss scaled by an inserted GradScaler before backward" in log.applied
    assert "gradients unscaled before clipping" in log.applied
    assert "optimizer.step through the inserted GradScaler" in log.applied


def test_a_step_with_inf_gradients_is_skipped():
    model, x, y = setup()
    with applied(TuneSettings(amp="fp16")) as log:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = [p.detach().clone() for p in model.parameters()]
        norm = loop_step(model, opt, x, y, scale_loss=math.inf)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert not math.isfinite(norm)
    assert "a step with inf/NaN gradients was skipped and the scale lowered" in log.applied


def test_patches_are_undone():
    backward, clip, init = (
        torch.Tensor.backward,
        torch.nn.utils.clip_grad_norm_,
        torch.optim.Optimizer.__init__,
    )
    with applied(TuneSettings(amp="fp16")):
        assert torch.Tensor.backward is not backward
    assert torch.Tensor.backward is backward and torch.nn.utils.clip_grad_norm_ is clip
    assert torch.optim.Optimizer.__init__ is init


def test_fp16_offered_only_on_gpus_without_bf16():
    knob = AmpKnob()
    cands, reason = knob.candidates(ModelFacts(device="cuda", bf16_supported=False, models=["Net"]))
    assert reason is None and [c.amp for c in cands] == ["fp16"]
    cands, _ = knob.candidates(ModelFacts(device="cuda", bf16_supported=True, models=["Net"]))
    assert [c.amp for c in cands] == ["bf16"]
    _, reason = knob.candidates(ModelFacts(device="cpu", bf16_supported=False, models=["Net"]))
    assert reason and "not supported natively" in reason


def test_fp32_attention_variant_only_when_the_model_calls_attention():
    knob = AmpKnob()
    facts = ModelFacts(device="cpu", bf16_supported=True, models=["Net"], attention_calls=0)
    cands, _ = knob.candidates(facts)
    assert [c.label() for c in cands] == ["amp=bf16"]
    assert "never calls F.scaled_dot_product_attention" in knob.skipped_candidates(facts)[0][1]
    facts.attention_calls = 8
    assert len(knob.candidates(facts)[0]) == 2 and not knob.skipped_candidates(facts)


def test_facts_count_attention_calls_and_restore_the_function():
    import torch.nn.functional as F

    from torchscalpel.record import new_run_record
    from torchscalpel.tune.facts import FactsObserver

    original = F.scaled_dot_product_attention
    obs = FactsObserver()
    obs.on_start(None)  # type: ignore[arg-type]
    q = torch.randn(1, 2, 4, 8)
    F.scaled_dot_product_attention(q, q, q)
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    record = new_run_record("t", status="complete")
    obs.on_finish(record)
    assert F.scaled_dot_product_attention is original
    assert record.sections["tune_facts"]["attention_calls"] == 2

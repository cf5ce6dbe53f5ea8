"""The strategy model, max-batch search, recommendation, check_fits and the report section."""

from __future__ import annotations

import dataclasses

import pytest
from torch import nn

from torchscalpel.plan import PlanRequest, check_fits, make_plan
from torchscalpel.plan.devices import Device
from torchscalpel.plan.simulate import OptimizerSpec, SimSettings, build_meta_model, simulate
from torchscalpel.plan.spec import parse_batch_spec
from torchscalpel.plan.strategies import DDP_BUCKET_CAP, evaluate, strategies_for
from torchscalpel.record import RunRecord
from torchscalpel.report.plan_sections import build

MIB = 1024**2
BIG_CPU = Device(name="cpu", memory=1 << 40, kind="cpu")
BIG_GPU = Device(name="gpu", memory=1 << 40, kind="cuda")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(32, 256)
        self.layers = nn.ModuleList(
            [nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)) for _ in range(4)]
        )
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


SPEC = parse_batch_spec("x=float32[64,32],y=int64[64]:10")


@pytest.fixture(scope="module")
def measured():
    return simulate(
        lambda: build_meta_model(_Net, "fp32"), SPEC, SimSettings(optimizer=OptimizerSpec.named("adamw"))
    )


def test_single_is_the_measured_peak(measured):
    bd = evaluate(measured, "single", world_size=1, nodes=1, device=BIG_CPU)
    assert bd.peak == measured.peak_bytes
    assert bd.params + bd.grads + bd.optim + bd.activations + bd.comm == bd.peak
    assert bd.weights_optimizer_rule == measured.param_bytes + measured.grad_bytes + measured.optim_bytes


def test_ddp_adds_one_bucket_copy_of_the_gradients(measured):
    single = evaluate(measured, "single", world_size=1, nodes=1, device=BIG_GPU)
    ddp = evaluate(measured, "ddp", world_size=2, nodes=1, device=BIG_GPU)
    assert ddp.peak == single.peak + measured.trainable_bytes
    gloo = evaluate(measured, "ddp", world_size=2, nodes=1, device=BIG_CPU)
    assert gloo.peak >= ddp.peak  # gloo's all-reduce work buffer during backward
    assert gloo.peak <= ddp.peak + min(measured.trainable_bytes, DDP_BUCKET_CAP)


def test_fsdp_shards_states_and_adds_unit_buffers(measured):
    full2 = evaluate(measured, "fsdp-full", world_size=2, nodes=1, device=BIG_GPU)
    full8 = evaluate(measured, "fsdp-full", world_size=8, nodes=1, device=BIG_GPU)
    assert full8.peak < full2.peak
    # at the peak the states are the measured curves divided by the shard size
    assert full8.optim <= measured.optim_bytes / 8 + 1
    unit = max(s for _, s in measured.blocks)
    assert full2.comm >= 2 * unit  # at least the current block unsharded + the last all-gather's output
    grad_op = evaluate(measured, "fsdp-grad-op", world_size=8, nodes=1, device=BIG_GPU)
    assert grad_op.peak > full8.peak  # blocks stay gathered between forward and backward
    hybrid = evaluate(measured, "fsdp-hybrid", world_size=8, nodes=2, device=BIG_GPU)
    full4 = evaluate(measured, "fsdp-full", world_size=4, nodes=1, device=BIG_GPU)
    assert hybrid.peak == pytest.approx(full4.peak, abs=2)  # sharded over the 4 ranks of a node


def test_strategies_for_all():
    assert strategies_for("all", 1, 1) == ["single"]
    assert strategies_for("all", 8, 1) == ["ddp", "fsdp-grad-op", "fsdp-full"]
    assert strategies_for("all", 16, 2)[-1] == "fsdp-hybrid"
    assert strategies_for("ddp", 8, 1) == ["ddp"]


def _request(
    memory: int, strategies: list[str], world: int = 2, ckpt: str = "none", search: bool = True
) -> PlanRequest:
    return PlanRequest(
        builder=_Net,
        batch=SPEC,
        settings=SimSettings(optimizer=OptimizerSpec.named("adamw")),
        strategies=strategies,
        world_size=world,
        device=Device(name="t", memory=memory, kind="cpu"),
        checkpointing=ckpt,
        search_max_batch=search,
        model_name="net",
    )


def test_max_batch_fits_and_one_more_step_does_not(measured):
    result = make_plan(_request(int(measured.peak_bytes * 3), ["ddp", "fsdp-full"]))
    for row in result.rows:
        mb = row.max_batch
        assert mb and mb > SPEC.batch_size
        at = simulate(
            lambda: build_meta_model(_Net, "fp32"),
            SPEC.with_batch(mb),
            SimSettings(optimizer=OptimizerSpec.named("adamw")),
        )
        over = simulate(
            lambda: build_meta_model(_Net, "fp32"),
            SPEC.with_batch(int(mb * 1.15) + 1),
            SimSettings(optimizer=OptimizerSpec.named("adamw")),
        )
        strategy = row.breakdown.strategy
        assert (
            evaluate(at, strategy, world_size=2, nodes=1, device=BIG_CPU).peak <= result.request.device.memory
        )
        assert (
            evaluate(over, strategy, world_size=2, nodes=1, device=BIG_CPU).peak
            > result.request.device.memory
        )
    assert result.rows[1].max_batch >= result.rows[0].max_batch  # sharding leaves more room


def test_recommendation_prefers_ddp_then_sharding_then_checkpointing(measured):
    roomy = make_plan(_request(1 << 40, ["ddp", "fsdp-grad-op", "fsdp-full"], search=False))
    assert roomy.recommended == "ddp"
    ddp_peak = roomy.rows[0].breakdown.peak
    full_peak = roomy.rows[2].breakdown.peak
    tight = make_plan(_request((ddp_peak + full_peak) // 2, ["ddp", "fsdp-full"], search=False))
    assert tight.recommended == "fsdp-full"
    assert not tight.rows[0].breakdown.fits
    none = make_plan(_request(int(measured.param_bytes * 1.1), ["ddp", "fsdp-full"], world=2))
    assert none.recommended is None
    assert none.alternatives and all(r.breakdown.checkpointing for r in none.alternatives)
    assert "Nothing fits" in none.recommendation


def test_check_fits_for_launch():
    ok, why = check_fits(_request(1 << 40, ["ddp"]))
    assert ok and "ddp" in why
    bad, why = check_fits(_request(1024, ["ddp"]))
    assert not bad and "Nothing fits" in why


def test_report_section_renders_the_plan_rows():
    result = make_plan(_request(1 << 40, ["ddp", "fsdp-full"], search=False))
    record = RunRecord(sections={"plan": result.to_dict()})
    (section,) = build(record)
    assert section.id == "plan"
    assert "fsdp-full" in section.body and 'data-chart="plan-memory"' in section.body
    assert "Recommendation" in section.body
    assert build(RunRecord()) == []


def test_custom_loss_and_checkpointed_rows():
    """--loss FN(model, batch) is what runs; --activation-checkpointing blocks marks and lowers the rows."""

    def heavy_loss(model, batch):
        out = model(batch["x"])
        big = out.unsqueeze(-1).expand(-1, -1, 4096).contiguous()  # a 64 x 10 x 4096 float intermediate
        return big.pow(2).mean()

    spec = parse_batch_spec("x=float32[64,32]")
    plain = simulate(
        lambda: build_meta_model(_Net, "fp32"), spec, SimSettings(optimizer=OptimizerSpec.named("sgd"))
    )
    heavy = simulate(
        lambda: build_meta_model(_Net, "fp32"),
        spec,
        SimSettings(optimizer=OptimizerSpec.named("sgd")),
        heavy_loss,
    )
    assert heavy.act_peak_bytes >= plain.act_peak_bytes + 64 * 10 * 4096 * 4
    request = _request(1 << 40, ["fsdp-full"], ckpt="blocks", search=True)
    result = make_plan(request)
    assert result.rows[0].breakdown.checkpointing
    assert (
        result.other_checkpointing_act_peak > result.measurement.act_peak_bytes
    )  # without checkpointing: more


def _replayed(marks, reshard_after_forward: bool) -> list[int]:
    """fsdp2_unit_bytes on a hand-made timeline: root 100 B, blocks a 10 B and b 20 B, 2 ranks."""
    import numpy as np

    from torchscalpel.plan.simulate import Measurement
    from torchscalpel.plan.strategies import fsdp2_unit_bytes
    from torchscalpel.plan.tracker import CATEGORIES, Timeline

    phase = np.array([1] * 10 + [2] * 10 + [3] * 2)
    tl = Timeline(
        bytes={c: np.zeros(phase.size, dtype=np.int64) for c in CATEGORIES},
        phase=phase,
        phase_names=["setup", "forward", "backward", "optimizer"],
        marks=marks,
    )
    m = Measurement(
        batch=1,
        timeline=tl,
        param_bytes=130,
        trainable_bytes=130,
        buffer_bytes=0,
        grad_bytes=130,
        optim_bytes=0,
        input_bytes=0,
        saved_bytes=0,
        peak_bytes=0,
        act_peak_bytes=0,
        blocks=[("a", 10), ("b", 20)],
        root_param_bytes=100,
        param_count=130,
    )
    return [int(x) for x in fsdp2_unit_bytes(m, 2, reshard_after_forward=reshard_after_forward)]


# forward: root, a, b; the loss inside the root, so its pre-backward comes first; its head's gradient
# (40 B) early in backward, its embedding's (60 B) last
UNIT_MARKS = [
    (0, 1, "pre_forward", "", 0),
    (1, 1, "pre_forward", "a", 0),
    (3, 1, "post_forward", "a", 0),
    (3, 1, "pre_forward", "b", 0),
    (5, 1, "post_forward", "b", 0),
    (6, 1, "post_forward", "", 0),
    (10, 2, "pre_backward", "", 0),
    (11, 2, "grad", "", 40),
    (12, 2, "pre_backward", "b", 0),
    (13, 2, "grad", "b", 20),
    (15, 2, "pre_backward", "a", 0),
    (16, 2, "grad", "a", 10),
    (18, 2, "grad", "", 60),
]


def test_fsdp2_replay_full_sharding_gathers_reshards_prefetches_and_holds_the_last_buffers():
    assert _replayed(UNIT_MARKS, True) == [
        200,  # root gathered (100) + its all-gather output (100)
        120,
        120,  # + a (10); the root's all-gather output freed when a's is issued
        140,
        140,
        120,  # a resharded, b gathered; b resharded after its forward
        20,
        20,
        20,
        20,  # only b's all-gather output, until the next all-gather
        140,  # backward: root re-gathered, b prefetched (its output replaces the root's)
        160,
        160,
        160,
        160,
        160,  # + the head's unsharded gradient (half of 40 on top of the shard)
        140,
        140,  # b then a reduce-scattered and resharded; a's scatter input held (10)
        110,
        110,  # root reduced and resharded: its scatter input (100) + a's gather output (10)
        0,
        0,  # the end of backward releases the last buffers
    ]


def test_fsdp2_replay_grad_op_keeps_units_gathered_until_their_backward():
    assert _replayed(UNIT_MARKS, False) == [
        200,
        120,
        120,
        150,
        150,
        150,
        150,
        150,
        150,
        150,
        150,
        170,
        170,
        170,
        170,
        170,
        150,
        150,
        120,
        120,
        0,
        0,
    ]


def test_simulation_marks_each_unit_forward_backward_and_gradients(measured):
    marks = measured.timeline.marks
    blocks = [name for name, _ in measured.blocks]
    forward = [(kind, unit) for _, _, kind, unit, _ in marks if kind.endswith("forward")]
    one_step = [("pre_forward", "")]
    for b in blocks:
        one_step += [("pre_forward", b), ("post_forward", b)]
    one_step.append(("post_forward", ""))
    assert forward == one_step * 2  # two simulated steps
    backward = [unit for _, _, kind, unit, _ in marks if kind == "pre_backward"]
    assert backward == ["", *reversed(blocks)] * 2  # the root's output first, then the blocks in reverse
    grads = [(unit, n) for _, _, kind, unit, n in marks if kind == "grad"]
    assert sum(n for _, n in grads) == 2 * measured.trainable_bytes  # every gradient, once per step


def test_progress_reports_each_row_and_grows_when_checkpointed_rows_follow(measured):
    seen: list[tuple[int, int, str]] = []
    fits = dataclasses.replace(
        _request(int(measured.peak_bytes * 3), ["ddp", "fsdp-full"], search=False),
        progress=lambda *a: seen.append(a),
    )
    make_plan(fits)
    assert seen == [(1, 2, "ddp"), (2, 2, "fsdp-full")]
    seen.clear()
    nothing_fits = dataclasses.replace(
        _request(1024, ["ddp"], search=False), progress=lambda *a: seen.append(a)
    )
    make_plan(nothing_fits)
    assert seen == [(1, 1, "ddp"), (2, 2, "ddp + checkpointing")]

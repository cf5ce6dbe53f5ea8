"""Runtime doctor rules driven directly through their observer methods, with real tiny models."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from torchscalpel.doctor.rules.rt_graph import EvalInTrainMode, EvalWithoutNoGrad, LossGraphRetained
from torchscalpel.doctor.rules.rt_model import ModuleInPlainContainer, TensorAttributeNotRegistered
from torchscalpel.doctor.rules.rt_optim import FrozenParamInOptimizer, GradNotZeroed, ParamNotInOptimizer
from torchscalpel.doctor.rules.rt_perf import HostDeviceCopyBound
from torchscalpel.doctor.runtime_rules import DoctorObserver, RuntimeRule
from torchscalpel.findings import Severity
from torchscalpel.record import RunRecord, StepRecord


def session(*roots: nn.Module, optimizers=()) -> SimpleNamespace:
    return SimpleNamespace(
        root_modules=list(roots), optimizers=list(optimizers), loaders=[], request_stop=lambda r: None
    )


def rules_of(rule: RuntimeRule, record=None) -> list[str]:
    return [f.rule for f in rule.findings(record)]


def train(
    rule: GradNotZeroed, model: nn.Module, opt, *, steps: int, accum: int = 1, zero: bool = True
) -> None:
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for _ in range(steps):
        for _ in range(accum):
            loss = nn.functional.mse_loss(model(x), y)
            rule.on_backward_pre((loss,))
            loss.backward()
        rule.on_optimizer_step_pre(opt)
        opt.step()
        rule.on_optimizer_step_post(opt)
        if zero:
            opt.zero_grad()


@pytest.mark.parametrize(
    ("accum", "zero", "fires"), [(1, False, True), (1, True, False), (4, True, False), (4, False, True)]
)
def test_grad_not_zeroed_mechanism(accum: int, zero: bool, fires: bool) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rule = GradNotZeroed()
    train(rule, model, opt, steps=5, accum=accum, zero=zero)
    assert ("grad-not-zeroed" in rules_of(rule)) is fires


def test_grad_not_zeroed_zero_grad_set_to_none_false_counts_as_cleared() -> None:
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rule = GradNotZeroed()
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for _ in range(4):
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.mse_loss(model(x), y)
        rule.on_backward_pre((loss,))
        loss.backward()
        rule.on_optimizer_step_pre(opt)
        opt.step()
        rule.on_optimizer_step_post(opt)
    assert rules_of(rule) == []


def test_param_not_in_optimizer_names_the_missing_head() -> None:
    body, head = nn.Linear(4, 4), nn.Linear(4, 1)
    model = nn.Sequential(body, head)
    opt = torch.optim.SGD(body.parameters(), lr=0.1)
    rule = ParamNotInOptimizer()
    rule.session = session(model, optimizers=[opt])
    model(torch.randn(2, 4)).sum().backward()
    rule.on_optimizer_step_pre(opt)
    (f,) = rule.findings(None)
    assert f.rule == "param-not-in-optimizer" and "Sequential.1.weight" in f.evidence[0]
    ok = ParamNotInOptimizer()
    opt2 = torch.optim.SGD(model.parameters(), lr=0.1)
    ok.session = session(model, optimizers=[opt2])
    ok.on_optimizer_step_pre(opt2)
    assert rules_of(ok) == []


def test_param_not_in_optimizer_ignores_frozen_and_gradless_models() -> None:
    student, teacher = nn.Linear(4, 1), nn.Linear(4, 1)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    rule = ParamNotInOptimizer()
    rule.session = session(student, teacher, optimizers=[opt])
    with torch.no_grad():
        target = teacher(torch.randn(2, 4))
    nn.functional.mse_loss(student(torch.randn(2, 4)), target).backward()
    rule.on_optimizer_step_pre(opt)
    assert rules_of(rule) == []


def test_frozen_after_optimizer_built_fires_frozen_before_does_not() -> None:
    original = torch.optim.Optimizer.add_param_group
    rule = FrozenParamInOptimizer()
    undo = rule.setup()
    try:
        late = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        opt = torch.optim.SGD(late.parameters(), lr=0.1)
        late[0].weight.requires_grad_(False)
        rule.session = session(late, optimizers=[opt])
        rule.on_optimizer_step_pre(opt)
        assert rules_of(rule) == ["frozen-param-in-optimizer"]

        early_rule = FrozenParamInOptimizer()
        undo2 = early_rule.setup()
        try:
            early = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
            early[0].weight.requires_grad_(False)
            opt2 = torch.optim.SGD(early.parameters(), lr=0.1)
            early_rule.on_optimizer_step_pre(opt2)
            assert rules_of(early_rule) == []
        finally:
            undo2()
    finally:
        undo()
    assert torch.optim.Optimizer.add_param_group is original  # the patch is undone


def test_eval_in_train_mode_only_for_training_mode_dropout_or_bn_under_no_grad() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.2))
    rule = EvalInTrainMode()
    rule.on_forward_pre(model, (), {}, True)  # grad enabled: training forward
    assert rules_of(rule) == []
    with torch.no_grad():
        rule.on_forward_pre(model, (), {}, True)
    assert rules_of(rule) == ["eval-in-train-mode"]
    ok = EvalInTrainMode()
    model.eval()
    with torch.inference_mode():
        ok.on_forward_pre(model, (), {}, True)
    no_dropout = EvalInTrainMode()
    with torch.no_grad():
        no_dropout.on_forward_pre(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0)), (), {}, True)
    assert rules_of(ok) == [] and rules_of(no_dropout) == []


def test_eval_without_no_grad_counts_unused_graphs_only() -> None:
    model = nn.Linear(4, 1)
    rule = EvalWithoutNoGrad()
    x = torch.randn(2, 4)
    for _ in range(3):  # training: forward, backward, step
        out = model(x)
        rule.on_forward_post(model, (x,), {}, out, True)
        out.sum().backward()
        rule.on_backward_post((out,))
        rule.on_optimizer_step_post(None)
    assert rules_of(rule) == [] and rule.used == 3
    for _ in range(3):  # evaluation with autograd on
        out = model(x)
        rule.on_forward_post(model, (x,), {}, out, True)
    rule.on_finish(RunRecord(status="complete"))
    assert rules_of(rule) == ["eval-without-no-grad"]


def test_loss_graph_retained_sees_summed_losses_not_items() -> None:
    model = nn.Linear(4, 1)
    x = torch.randn(2, 4)
    bad, good = LossGraphRetained(), LossGraphRetained()
    total, running = 0, 0.0
    for _ in range(8):
        for rule in (bad, good):
            loss = model(x).pow(2).mean()
            rule.on_backward_pre((loss,))
            loss.backward()
            rule.on_optimizer_step_post(None)
            if rule is bad:
                total = total + loss
            else:
                running += loss.item()
            del loss
    assert rules_of(bad) == ["loss-graph-retained"] and rules_of(good) == []


class Hidden(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = [nn.Linear(2, 2), nn.Linear(2, 2)]
        self.ok = nn.ModuleList([nn.Linear(2, 2)])
        self.alias = list(self.ok)
        self.scale = torch.ones(2)
        self.register_buffer("mean", torch.zeros(2))


def test_module_scan_rules_compare_attributes_with_registered_children() -> None:
    model = Hidden()
    container, tensors = ModuleInPlainContainer(), TensorAttributeNotRegistered()
    for rule in (container, tensors):
        rule.on_forward_pre(model, (), {}, True)
    (c,) = container.findings(None)
    assert "Hidden.blocks" in c.message and "2 module(s)" in c.message and c.location is not None
    (t,) = tensors.findings(None)
    assert "Hidden.scale" in t.message  # the registered buffer 'mean' is not reported


def test_module_in_plain_container_leaves_modules_without_parameters_or_buffers_alone() -> None:
    class Stateless(nn.Module):
        def __init__(self, extra: nn.Module) -> None:
            super().__init__()
            self.body = nn.Linear(2, 2)
            self.acts = [nn.ReLU(), nn.GELU()]  # nothing to register: nothing lost
            self.losses = {"ce": nn.CrossEntropyLoss()}
            self.extra = [extra]

    quiet, loud = ModuleInPlainContainer(), ModuleInPlainContainer()
    quiet.on_forward_pre(Stateless(nn.Dropout(0.1)), (), {}, True)
    loud.on_forward_pre(Stateless(nn.BatchNorm1d(2, affine=False)), (), {}, True)  # buffers only
    assert list(quiet.findings(None)) == []
    assert [f.message.split(" is ")[0] for f in loud.findings(None)] == ["Stateless.extra"]


def test_module_scan_rules_judge_the_users_classes_not_an_installed_librarys() -> None:
    """Issue 44: transformers 5 keeps a plain dict of kernel modules on LlamaAttention; that is the
    library's design, not the user's pitfall. A user's class holding the same library model still counts."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
    )  # fmt: skip
    library = transformers.LlamaForCausalLM(config)
    # the premise: somewhere inside the library model a plain container holds an unregistered module
    registered = {id(m) for m in library.modules()}
    assert any(
        isinstance(v, nn.Module) and id(v) not in registered
        for m in library.modules()
        for value in vars(m).values()
        if isinstance(value, dict | list | tuple)
        for v in (value.values() if isinstance(value, dict) else value)
    ) or transformers.__version__.startswith("4."), "the premise no longer holds: update this test"

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = library
            self.heads = [nn.Linear(2, 2)]

    container, tensors = ModuleInPlainContainer(), TensorAttributeNotRegistered()
    for rule in (container, tensors):
        rule.on_forward_pre(Wrapper(), (), {}, True)
    assert [f.message.split(" is ")[0] for f in container.findings(None)] == ["Wrapper.heads"]
    assert list(tensors.findings(None)) == []


def test_crashing_runtime_rule_reports_internal_error_and_others_continue() -> None:
    class Broken(RuntimeRule):
        slugs = ("loss-diverging",)

        def on_backward_pre(self, tensors):
            raise ZeroDivisionError("bad rule")

    broken, healthy = Broken(), EvalInTrainMode()
    doctor = DoctorObserver([broken, healthy])
    doctor.on_backward_pre((torch.ones(()),))
    with torch.no_grad():
        doctor.on_forward_pre(nn.Dropout(0.5), (), {}, True)
    found = doctor.findings(RunRecord())
    by_rule = {f.rule: f for f in found}
    assert (
        by_rule["loss-diverging"].severity == Severity.INFO
        and "bad rule" in by_rule["loss-diverging"].message
    )
    assert "eval-in-train-mode" in by_rule


def test_host_device_copy_bound_reads_profiled_copy_time() -> None:
    steps = [StepRecord(index=i, total_ms=10.0, profiled=True) for i in range(3)]
    hot = RunRecord(
        config={"device": "cuda:0"},
        steps=steps,
        profiler={"top_ops": [{"name": "Memcpy HtoD (Pageable -> Device)", "total_us": 9000.0}]},
    )
    cold = RunRecord(
        config={"device": "cuda:0"},
        steps=steps,
        profiler={"top_ops": [{"name": "Memcpy HtoD (Pinned -> Device)", "total_us": 1000.0}]},
    )
    assert rules_of(HostDeviceCopyBound(), hot) == ["host-device-copy-bound"]
    assert rules_of(HostDeviceCopyBound(), cold) == []


def test_time_cap_stops_once_and_remembers_after_how_many_steps() -> None:
    from torchscalpel.doctor.api import TimeCap

    stops: list[str] = []
    kinds: list[dict[str, object]] = []

    def request_stop(
        reason: str, **why: object
    ) -> None:  # the session's signature: reason, then kind and figures
        stops.append(reason)
        kinds.append(why)

    cap = TimeCap(seconds=1e-9)
    cap.session = SimpleNamespace(request_stop=request_stop)
    cap.on_step_end(None)
    cap.on_step_end(None)
    assert len(stops) == 1 and "time cap" in stops[0] and cap.capped_after == 1 and cap.steps == 2
    assert kinds == [{"kind": "time-cap", "cap_s": 1e-9}]  # what the end-of-run wording reads
    cap.on_finish(SimpleNamespace(steps=[1, 2, 3]))
    assert cap.capped_after == 3  # what the record kept
    for seconds in (None, 0, 3600.0):  # no cap, or one far away: never stops, never reports a cut
        patient = TimeCap(seconds=seconds)
        patient.session = SimpleNamespace(request_stop=request_stop)
        patient.on_step_end(None)
        assert patient.capped_after is None
    assert len(stops) == 1


def test_no_update_rule_fires_only_when_steps_never_change_parameters() -> None:
    from torchscalpel.doctor.rules.rt_grads import NoUpdate

    def run(zero_before_step: bool) -> list[str]:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rule = NoUpdate()
        for _ in range(6):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            if zero_before_step:
                opt.zero_grad()  # the bug: gradients gone before the update
            rule.on_optimizer_step_pre(opt)
            opt.step()
            rule.on_optimizer_step_post(opt)
        return rules_of(rule)

    assert run(True) == ["cannot-overfit-batch"]
    assert run(False) == []


def test_ddp_batchnorm_is_a_warning_with_syncbatchnorm_fix_only_off_the_cpu(monkeypatch) -> None:
    from torchscalpel.doctor.rules import rt_dist

    monkeypatch.setattr(rt_dist, "_is_ddp", lambda m: True)  # no process group needed to scan
    severities = {}
    for device in ("cpu", "meta"):  # meta stands in for a GPU: any non-CPU device can sync
        rule = rt_dist.DdpBatchnormNotSynced()
        rule.scan(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(device))
        (finding,) = rule.findings(None)
        severities[device] = finding.severity
        if device == "meta":
            assert finding.fix.startswith("model = nn.SyncBatchNorm.convert_sync_batchnorm(model)")
    assert severities == {"cpu": Severity.INFO, "meta": Severity.WARNING}


def test_zero_gradients_are_an_error_that_tells_died_units_from_a_detached_graph() -> None:
    from torchscalpel.doctor.rules.rt_grads import GradNorms

    died = GradNorms()
    died.norms, died.zero_steps = [1.5, 3.0, 0.0, 0.0, 0.0, 0.0], 4
    (f,) = [f for f in died.findings(None) if f.rule == "vanishing-gradients"]
    assert f.severity == Severity.ERROR and "units died" in f.message and "lr / 10" in f.fix
    assert "from step 2 on" in f.evidence[0]
    never = GradNorms()
    never.norms, never.zero_steps = [0.0] * 5, 5
    (g,) = [g for g in never.findings(None) if g.rule == "vanishing-gradients"]
    assert g.severity == Severity.ERROR and ".detach()" in g.fix and "died" not in g.message


def test_loss_diverging_baseline_excludes_an_early_blow_up_and_short_crashed_runs_count() -> None:
    from torchscalpel.doctor.rules.rt_numerics import LossDiverging

    def record(losses, status="complete", error=None):
        return RunRecord(
            steps=[StepRecord(index=i, loss=x) for i, x in enumerate(losses)], status=status, error=error
        )

    # 9.28 -> 12767 then a crash: two steps are enough, the baseline is the first loss
    (f,) = LossDiverging().findings(record([9.28, 12767.0], status="failed", error="RuntimeError: boom"))
    assert "9.28 at the start" in f.message and "1376x" in f.message and "crashed" in f.message
    # a blow-up inside the first fifth no longer lifts the baseline: 10 steps at ~2, one at 5e7, back to ~2.1
    (g,) = LossDiverging().findings(record([1.6, 5e7, 3e6, 2.0, 2.1, 2.2, 2.0, 2.1, 2.05, 2.1]))
    assert "blew up" in g.message and "1.6 at the start" in g.message
    assert list(LossDiverging().findings(record([2.0, 1.8, 1.7, 1.5, 1.4, 1.2, 1.1, 1.0]))) == []
    # a steady rise is reported as a rise
    (h,) = LossDiverging().findings(record([1.0, 1.2, 1.5, 2.0, 2.6, 3.5, 4.0, 5.0]))
    assert "rises" in h.message

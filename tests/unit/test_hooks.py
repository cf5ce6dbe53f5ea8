"""The global hooks: removed after a run, observers isolated, no graph breaks under torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import dataloader as dl_module

from torchscalpel.runtime.hooks import HookSet
from torchscalpel.runtime.observer import Observer
from torchscalpel.runtime.session import RuntimeOptions, Session


class Recorder(Observer):
    name = "recorder"

    def __init__(self) -> None:
        self.events: list[str] = []

    def on_forward_pre(self, module, args, kwargs, root):
        if root:
            self.events.append("forward")

    def on_backward_pre(self, tensors):
        self.events.append("backward")

    def on_optimizer_step_post(self, optimizer):
        self.events.append("step")

    def on_batch(self, batch, loader):
        self.events.append(f"batch:{type(loader).__name__}")


class Broken(Observer):
    name = "broken"

    def on_forward_pre(self, module, args, kwargs, root):
        raise RuntimeError("observer bug")


def _train(n: int = 3) -> tuple[object, ...]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(n * 2, 4)), batch_size=2)
    for (x,) in loader:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt, loader


def test_hooks_fan_out_to_observers_and_are_fully_removed():
    originals = (
        torch.Tensor.backward,
        torch.autograd.backward,
        dl_module._BaseDataLoaderIter.__next__,
        dl_module.DataLoader.__iter__,
        optim_module.Optimizer.__init__,
    )
    rec = Recorder()
    session = Session(RuntimeOptions(steps=None), [Broken(), rec])
    hooks = HookSet(session)
    hooks.install()
    try:
        alive = _train(3)  # the session holds weak references only: keep the objects alive
    finally:
        hooks.remove()
    assert rec.events == ["batch:DataLoader", "forward", "backward", "step"] * 3
    assert len(session.timeline.steps) == 3 and session.timeline.kind == "optimizer"
    assert any("broken" in n and "disabled" in n for n in session.notes)
    assert len(session.optimizers) == 1 and len(session.loaders) == 1 and len(session.root_modules) == 1
    del alive
    assert (
        torch.Tensor.backward,
        torch.autograd.backward,
        dl_module._BaseDataLoaderIter.__next__,
        dl_module.DataLoader.__iter__,
        optim_module.Optimizer.__init__,
    ) == originals
    assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks
    assert not optim_module._global_optimizer_pre_hooks and not optim_module._global_optimizer_post_hooks


def test_compiled_model_has_no_graph_breaks_from_the_hooks():
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    session = Session(RuntimeOptions(steps=None), [])
    hooks = HookSet(session)
    hooks.install()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
        compiled = torch.compile(model, backend="aot_eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            compiled(torch.randn(4, 8)).sum().backward()
            opt.step()
    finally:
        hooks.remove()
        torch._dynamo.reset()
    assert dict(counters["graph_break"]) == {}
    assert len(session.timeline.steps) == 3
    assert all(s.forward_ms > 0 for s in session.timeline.steps)


def test_grad_scaler_losses_are_recorded_unscaled_and_samples_sum_over_micro_batches():
    session = Session(RuntimeOptions(steps=None), [])
    hooks = HookSet(session)
    hooks.install()
    try:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        # GradScaler on CPU: enabled, so the loss backward runs on is multiplied by 2**10.
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        x = torch.ones(3, 4)
        for _ in range(2):
            for _micro in range(2):
                loss = model(x).pow(2).mean() + 1.0
                scaler.scale(loss).backward()
            expected = loss.item()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    finally:
        hooks.remove()
    steps = session.timeline.steps
    assert len(steps) == 2
    # The sum over micro-batches of what backward ran on (identical here), not expected * 1024.
    assert steps[-1].loss == pytest.approx(2 * expected)
    assert steps[-1].samples == 6 and steps[-1].micro_batches == 2


def test_after_warmup_timeline_mode_hooks_only_the_root_modules():
    session = Session(RuntimeOptions(warmup=1, steps=None), [])
    hooks = HookSet(session)
    session.hooks = hooks
    hooks.install()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(4):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            if i == 0:
                # narrowed at the end of the warm-up step: no global forward hooks, hooks on the root only
                assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks
                assert len(model._forward_pre_hooks) == 1 and not model[0]._forward_pre_hooks
    finally:
        hooks.remove()
    assert not model._forward_pre_hooks and not model._forward_hooks
    steps = session.timeline.steps
    assert len(steps) == 4 and all(s.forward_ms > 0 and s.forward_calls == 1 for s in steps)


def test_observers_that_want_module_events_keep_the_global_hooks():
    rec = Recorder()
    session = Session(RuntimeOptions(warmup=1, steps=None), [rec])
    hooks = HookSet(session)
    session.hooks = hooks
    hooks.install()
    try:
        alive = _train(3)
        assert nn_module._global_forward_pre_hooks
    finally:
        hooks.remove()
    assert rec.events.count("forward") == 3
    del alive


def _run(body, **options):
    """Run ``body()`` under a fresh session's hooks; return the session."""
    session = Session(RuntimeOptions(steps=None, **options), [])
    hooks = HookSet(session)
    session.hooks = hooks
    hooks.install()
    try:
        body()
    finally:
        hooks.remove()
        session.timeline.finish()
    return session


def test_closure_steps_are_optimizer_steps_with_forward_and_backward_inside():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    first_losses = []

    def body():
        opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
        for _ in range(4):

            def closure():
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            first_losses.append(float(opt.step(closure)))

    steps = _run(body).timeline.steps
    assert len(steps) == 4
    assert all(s.forward_ms > 0 and s.backward_ms > 0 and s.optimizer_ms > 0 for s in steps)
    assert [s.samples for s in steps] == [16] * 4  # the first closure evaluation only
    assert [s.closure_evals for s in steps] == [3] * 4 and {s.micro_batches for s in steps} == {1}
    assert [s.loss for s in steps] == pytest.approx(first_losses)  # what step() returned


def test_checkpointed_blocks_recompute_inside_backward_and_do_not_split_steps():
    from torch.utils.checkpoint import checkpoint

    blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
    head = torch.nn.Linear(8, 1)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks, self.head = blocks, head

        def forward(self, x):
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False)
            return self.head(x)

    net = Net()

    def body():
        opt = torch.optim.AdamW(net.parameters())
        for _ in range(3):
            net(torch.randn(5, 8)).sum().backward()
            opt.step()
            opt.zero_grad()

    session = _run(body)
    steps = session.timeline.steps
    assert session.timeline.kind == "optimizer" and len(steps) == 3
    assert steps[0].recomputed_forwards == 2 and steps[0].forward_calls == 1
    assert list(session.root_modules) == [net]  # recomputed blocks are not root models


def test_evaluation_forwards_before_training_are_not_steps():
    model = torch.nn.Linear(4, 2)

    def body():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.no_grad():  # estimate_loss() before the first step
            for _ in range(5):
                model(torch.randn(3, 4))
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()

    session = _run(body)
    assert [s.forward_calls for s in session.timeline.steps] == [1, 1]
    assert session.eval_forwards == 5


def test_inference_without_an_optimizer_is_still_forward_delimited():
    model = torch.nn.Linear(4, 2)

    def body():
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(3, 4))

    session = _run(body)
    assert session.timeline.kind == "forward" and len(session.timeline.steps) == 3


def test_loss_modules_do_not_count_samples_and_sequence_first_models_use_dim_1():
    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 8)
            self.rnn = torch.nn.LSTM(8, 8)  # batch_first=False: inputs are (seq, batch)
            self.out = torch.nn.Linear(8, 10)

        def forward(self, x):
            return self.out(self.rnn(self.emb(x))[0])

    model, criterion = LM(), torch.nn.CrossEntropyLoss()

    def body():
        for _ in range(2):
            x = torch.randint(0, 10, (35, 20))
            out = model(x)
            criterion(out.view(-1, 10), x.view(-1)).backward()  # 700 targets: not samples
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.1)
                    p.grad = None

    steps = _run(body).timeline.steps
    assert [s.samples for s in steps] == [20, 20]


def test_a_grad_scaler_step_that_skips_the_update_still_ends_the_step():
    model = torch.nn.Linear(2, 1)

    def body():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
        for i in range(3):
            loss = model(torch.ones(1, 2)).sum() * (float("inf") if i == 1 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()

    steps = _run(body).timeline.steps
    assert len(steps) == 3
    assert [s.skipped_update for s in steps] == [False, True, False]


def test_no_recognised_step_stops_the_run_with_what_it_saw():
    from torchscalpel.runtime.session import StopScript

    model = torch.nn.Linear(2, 1)
    session = Session(RuntimeOptions(steps=5, step_timeout_s=0.01), [])
    hooks = HookSet(session)
    hooks.install()
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built (and kept), never stepped
        import time

        time.sleep(
            0.02
        )  # set-up before the loop is not held against it: the clock starts at the first forward
        with torch.no_grad():
            model(torch.ones(1, 2))
        time.sleep(0.02)
        with pytest.raises(StopScript, match=r"no step was recognised.*1 optimizer"), torch.no_grad():
            model(torch.ones(1, 2))
        assert opt.param_groups
    finally:
        hooks.remove()


def test_is_sequence_first_is_the_one_definition_for_layers() -> None:
    import torch

    from torchscalpel.runtime.hooks import _batch_dim, is_sequence_first

    assert is_sequence_first(torch.nn.LSTM(4, 4))
    assert not is_sequence_first(torch.nn.LSTM(4, 4, batch_first=True))
    assert is_sequence_first(torch.nn.MultiheadAttention(4, 1))
    assert is_sequence_first(torch.nn.TransformerEncoderLayer(4, 1))
    assert not is_sequence_first(torch.nn.TransformerEncoderLayer(4, 1, batch_first=True))
    assert not is_sequence_first(torch.nn.Linear(4, 4))
    # a bare attention layer does not make the whole model sequence-first (models transpose into it)
    assert _batch_dim(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.MultiheadAttention(4, 1))) == 0
    assert _batch_dim(torch.nn.Sequential(torch.nn.LSTM(4, 4))) == 1

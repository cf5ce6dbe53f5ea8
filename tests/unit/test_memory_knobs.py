"""The memory knobs: micro-batching gives the unsplit batch's gradients; checkpointing keeps them and saves memory."""

from __future__ import annotations

import torch
from torch import nn

from torchscalpel.runtime.alloc_tracker import AllocationTracker
from torchscalpel.tune.knobs import ApplyLog
from torchscalpel.tune.knobs.checkpointing import install_checkpointing
from torchscalpel.tune.knobs.microbatch import combine, install_microbatching
from torchscalpel.tune.settings import TuneSettings


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, d: int = 32, n: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], float]:
    model.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()], loss.item()


def _peak(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    tr = AllocationTracker()
    tr.start()
    try:
        tr.adopt(model.parameters(), "parameters")
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
    finally:
        tr.stop()
    return tr.peak


def test_microbatches_give_the_unsplit_gradients_and_less_memory() -> None:
    torch.manual_seed(0)
    model, x, y = Net(), torch.randn(512, 32), torch.randint(0, 5, (512,))
    ref, ref_loss = _grads(model, x, y)
    plain_peak = _peak(model, x, y)
    log = ApplyLog()
    undo = install_microbatching(4, log)
    try:
        got, loss = _grads(model, x, y)
        split_peak = _peak(model, x, y)
    finally:
        undo()
    assert "microbatch" in log.fired
    assert abs(loss - ref_loss) < 1e-6
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert split_peak < plain_peak
    assert nn.Module.__call__ is nn.Module._wrapped_call_impl  # undone


def test_an_epochs_last_smaller_batch_is_split_and_keeps_the_full_batch_gradient() -> None:
    # The style of pytorch/examples mnist: a DataLoader without drop_last, so the epoch ends on a smaller
    # batch (1000 rows in 640s: 640, then 360). With microbatches = 7 neither divides; both are split into 7
    # near-equal chunks (92 x 3 + 91 x 4 and 52 x 3 + 51 x 4), never run unsplit across the limit.
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = Net()
    data = TensorDataset(torch.randn(1000, 32), torch.randint(0, 5, (1000,)))
    batches = list(DataLoader(data, batch_size=640))
    assert [len(x) for x, _ in batches] == [640, 360]
    refs = [_grads(model, x, y) for x, y in batches]
    last_x, last_y = batches[-1]
    plain_peak = _peak(model, last_x, last_y)
    log = ApplyLog()
    undo = install_microbatching(7, log)
    try:
        got = [_grads(model, x, y) for x, y in batches]
        split_peak = _peak(model, last_x, last_y)
    finally:
        undo()
    assert not log.skipped, log.skipped
    assert "Net: batch 360 in 7 micro-batches of 52 and 51" in log.applied, log.applied
    assert "Net: batch 640 in 7 micro-batches of 92 and 91" in log.applied, log.applied
    for (ref, ref_loss), (grads, loss) in zip(refs, got, strict=True):
        assert abs(loss - ref_loss) < 1e-6
        for a, b in zip(ref, grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert split_peak < plain_peak


def test_a_batch_smaller_than_k_is_split_into_single_rows() -> None:
    torch.manual_seed(0)
    model, x, y = Net(), torch.randn(3, 32), torch.randint(0, 5, (3,))
    ref, ref_loss = _grads(model, x, y)
    log = ApplyLog()
    undo = install_microbatching(4, log)
    try:
        got, loss = _grads(model, x, y)
    finally:
        undo()
    assert log.applied == ["Net: batch 3 in 3 micro-batches of 1"]
    assert abs(loss - ref_loss) < 1e-6
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_combine_weights_a_scalar_loss_by_chunk_size() -> None:
    out = combine(
        [
            {"loss": torch.tensor(1.0), "logits": torch.ones(2, 3)},
            {"loss": torch.tensor(4.0), "logits": torch.zeros(6, 3)},
        ],
        [2, 6],
    )
    assert float(out["loss"]) == 1.0 * 0.25 + 4.0 * 0.75
    assert out["logits"].shape == (8, 3)


def test_checkpointing_blocks_keeps_gradients_and_saves_activations() -> None:
    torch.manual_seed(0)
    model, x, y = Net(), torch.randn(512, 32), torch.randint(0, 5, (512,))
    ref, _ = _grads(model, x, y)
    plain_peak = _peak(model, x, y)
    log = ApplyLog()
    undo = install_checkpointing(log)
    try:
        got, _ = _grads(model, x, y)
        ckpt_peak = _peak(model, x, y)
    finally:
        undo()
    assert "checkpointing" in log.fired
    assert all("forward" not in b.__dict__ for b in model.blocks)
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b)
    assert ckpt_peak < plain_peak


def test_checkpointing_with_microbatches_keeps_the_loss_and_gradients_and_saves_most() -> None:
    # Each checkpointed block recomputes its forward in backward, outside the micro-batch's own call:
    # the micro-batch knob must not split it again there (it used to, and checkpoint refused the shapes).
    torch.manual_seed(0)
    model, x, y = Net(), torch.randn(512, 32), torch.randint(0, 5, (512,))
    ref, ref_loss = _grads(model, x, y)
    peaks = {}
    for name, installs in (
        ("micro", (lambda log: install_microbatching(4, log),)),
        ("both", (install_checkpointing, lambda log: install_microbatching(4, log))),
    ):
        log = ApplyLog()
        undos = [install(log) for install in installs]
        try:
            got, loss = _grads(model, x, y)
            peaks[name] = _peak(model, x, y)
        finally:
            for undo in reversed(undos):
                undo()
        assert abs(loss - ref_loss) < 1e-6
        for a, b in zip(ref, got, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert "microbatch" in log.fired and (name == "micro" or "checkpointing" in log.fired)
    assert peaks["both"] < peaks["micro"]


def test_settings_round_trip_and_validation() -> None:
    s = TuneSettings(checkpointing="blocks", microbatches=4)
    assert TuneSettings.from_dict(s.to_dict()) == s
    for bad in ({"checkpointing": "all"}, {"microbatches": 1}):
        try:
            TuneSettings(**bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")


def test_fit_candidates_are_the_ladder_rungs_and_their_pairs() -> None:
    from torchscalpel.tune.fit import FitTrial, candidates

    ladder = [
        {"config": {"checkpointing": "blocks"}},
        {"config": {"microbatches": 4}},
        {"config": {}},
        {"config": {"amp": "bf16"}},
    ]
    base = FitTrial(TuneSettings(), False, None, None, section={"oom": {"ladder": ladder}})
    labels = [c.label() for c in candidates(base)]
    pair = TuneSettings(checkpointing="blocks", microbatches=4).label()
    assert labels == [
        "checkpointing=blocks",
        "microbatches=4",
        "amp=bf16",
        pair,
        "amp=bf16 + checkpointing=blocks",
        "amp=bf16 + microbatches=4",
    ]


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU())
        self.head = nn.Linear(64, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_microbatch_refuses_a_training_batchnorm_and_says_why() -> None:
    from torchscalpel.tune.knobs.microbatch import batch_statistics_modules, batchnorm_reason

    torch.manual_seed(0)
    model, x, y = BNNet(), torch.randn(64, 32), torch.randint(0, 5, (64,))
    ref_model = BNNet()
    ref_model.load_state_dict(model.state_dict())
    ref, ref_loss = _grads(ref_model, x, y)
    log = ApplyLog()
    undo = install_microbatching(4, log)
    try:
        got, loss = _grads(model, x, y)
    finally:
        undo()
    assert "microbatch" not in log.fired
    assert any("body.1 (BatchNorm1d)" in s and "ran unsplit" in s for s in log.skipped)
    assert loss == ref_loss  # unsplit: the whole batch's statistics
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b)
    # running statistics updated once, as in the plain step
    torch.testing.assert_close(model.body[1].running_mean, ref_model.body[1].running_mean)
    assert int(model.body[1].num_batches_tracked) == 1
    # a frozen (eval-mode) BatchNorm uses its running statistics: splitting is exact, so it is allowed
    model.body[1].eval()
    assert batchnorm_reason(model, batch_statistics_modules(model)) is None
    log = ApplyLog()
    undo = install_microbatching(4, log)
    try:
        _grads(model, x, y)
    finally:
        undo()
    assert "microbatch" in log.fired
    assert batch_statistics_modules(Net()) == []
    seq = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))  # named as the memory report names modules
    assert "Sequential has Sequential.1 (BatchNorm1d) in training mode" in str(
        batchnorm_reason(seq, batch_statistics_modules(seq))
    )


def test_the_ladder_does_not_offer_microbatches_to_a_batchnorm_model() -> None:
    from torchscalpel.memory.ladder import LadderPlanObserver, build_ladder

    obs = LadderPlanObserver()
    model = BNNet()
    obs.on_forward_pre(model, (torch.randn(8, 32),), {}, True)
    assert obs.batchnorm is not None and "BatchNorm1d" in obs.batchnorm
    plan = {"peak": 100, "batch": 32, "max_batch": 16, "batchnorm": obs.batchnorm}
    ladder = build_ladder(
        measured_peak=100,
        limit=50,
        plan=plan,
        cause="activations",
        breakdown={},
        phase="forward",
        growth=None,
        fragmentation=None,
    )
    rung = next(r for r in ladder if r["kind"] == "micro-batches")
    assert rung["config"] == {} and rung["fits"] is None and "not applied by scalpel run" in rung["why"]
    plain = build_ladder(
        measured_peak=100,
        limit=50,
        plan={**plan, "batchnorm": None},
        cause="activations",
        breakdown={},
        phase="forward",
        growth=None,
        fragmentation=None,
    )
    assert next(r for r in plain if r["kind"] == "micro-batches")["config"] == {"microbatches": 4}


class BNBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.bn = nn.Linear(16, 16), nn.BatchNorm1d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.bn(self.fc(x)))


class BNBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(BNBlock() for _ in range(3))
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def test_checkpointing_updates_batchnorm_running_stats_once() -> None:
    # the checkpoint's recompute in backward would update BatchNorm's running statistics a second time
    torch.manual_seed(0)
    plain, ckpt = BNBlocks(), BNBlocks()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(32, 16)
    plain(x).sum().backward()
    log = ApplyLog()
    undo = install_checkpointing(log)
    try:
        ckpt(x).sum().backward()
    finally:
        undo()
    assert "checkpointing" in log.fired
    for a, b in zip(plain.blocks, ckpt.blocks, strict=True):
        assert int(b.bn.num_batches_tracked) == 1
        torch.testing.assert_close(a.bn.running_mean, b.bn.running_mean)
        torch.testing.assert_close(a.bn.running_var, b.bn.running_var)
    for p, q in zip(plain.parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_the_microbatch_code_lines_give_the_full_batch_gradient_for_an_indivisible_batch() -> None:
    # The lines code.txt shows for microbatches = 4, executed on a batch of 10 (the last of an epoch).
    from torchscalpel.tune.knobs.microbatch import MicrobatchKnob

    torch.manual_seed(0)
    model, x, y = Net(), torch.randn(10, 32), torch.randint(0, 5, (10,))
    ref, _ = _grads(model, x, y)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loss_fn = nn.functional.cross_entropy
    exec(
        "\n".join(MicrobatchKnob().code_lines(TuneSettings(microbatches=4))),
        {"optimizer": optimizer, "x": x, "y": y, "model": model, "loss_fn": loss_fn},
    )
    for a, p in zip(ref, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-6)

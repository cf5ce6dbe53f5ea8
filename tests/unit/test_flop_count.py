"""FlopCountMode against torch's FlopCounterMode on one training step: equal totals in fp32 and under bf16
autocast; under checkpointing, model FLOPs apart from the recomputed forward's."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from torchscalpel.runtime.flop_count import FlopCountMode


class _Net(nn.Module):
    def __init__(self, reentrant: bool | None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 256)) for _ in range(2)
        )
        self.head = nn.Linear(256, 10)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).flatten(1)
        for block in self.blocks:
            h = block(h) if self.reentrant is None else checkpoint(block, h, use_reentrant=self.reentrant)
        return self.head(h)


def _step(model: nn.Module, opt: torch.optim.Optimizer, amp: bool) -> None:
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "reentrant", [None, False, True], ids=["plain", "checkpoint", "checkpoint-reentrant"]
)
def test_counts_equal_flop_counter_mode_with_recompute_apart(amp, reentrant):
    torch.manual_seed(0)
    model = _Net(reentrant)
    opt = torch.optim.Adam(model.parameters())
    _step(model, opt, amp)
    with FlopCounterMode(display=False) as theirs:
        _step(model, opt, amp)
    mine = FlopCountMode()
    with mine:
        _step(model, opt, amp)
    model_flops = sum(r["flops"] for r in mine.by_op())
    recompute = sum(r["recompute"] for r in mine.by_op())
    assert model_flops + recompute == theirs.get_total_flops()
    plain = _Net(None)
    plain_opt = torch.optim.Adam(plain.parameters())
    _step(plain, plain_opt, amp)
    with FlopCounterMode(display=False) as unchecked:
        _step(plain, plain_opt, amp)
    assert model_flops == unchecked.get_total_flops()  # recomputation is not model FLOPs
    # reentrant checkpointing re-runs both blocks' matmuls; non-reentrant stops once the saved tensors
    # backward needs are back (the first Linear of each block)
    block = 2 * 8 * 256 * 64
    assert recompute == {None: 0, False: 2 * block, True: 4 * block}[reentrant]
    assert mine.ops > 0 and any(r["name"] == "aten::convolution_backward" for r in mine.by_op())


_LIB = torch.library.Library("scalpel_flop_test", "DEF")
_LIB.define("scaled(Tensor x, Tensor w) -> Tensor")
# Its own CPU kernel and a composite decomposition that round apart on purpose (x @ w against
# (x @ w) + 1e-3): the way silu_backward's fused kernel and its decomposition differ in the last bit.
_LIB.impl("scaled", lambda x, w: x @ w, "CPU")
_LIB.impl("scaled", lambda x, w: torch.mm(x, w) + 1e-3, "CompositeImplicitAutograd")


def test_a_composite_op_computes_with_its_own_kernel_and_counts_its_decomposition():
    """The counting step computes what the plain step computes (issue 44: profiling moved a Llama's
    gradients by an ulp when silu_backward ran decomposed), yet counts the decomposition's FLOPs."""
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with torch.inference_mode():  # below autograd, where the composite kernel is not taken first
        plain = torch.ops.scalpel_flop_test.scaled(x, w)
        mode = FlopCountMode()
        with mode:
            counted = torch.ops.scalpel_flop_test.scaled(x, w)
        with FlopCounterMode(display=False) as theirs:
            torch.ops.scalpel_flop_test.scaled(x, w)
    assert torch.equal(counted, plain)
    assert sum(r["flops"] for r in mode.by_op()) == theirs.get_total_flops() == 2 * 4 * 8 * 3
    assert mode.ops == 1  # the meta decomposition is not a dispatched op of the step


def _fixture_module(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures" / "witness" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_unit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fwd_bwd(module: nn.Module, x: torch.Tensor, state=None) -> None:
    out = module(x, state) if state is not None else module(x)
    out = out[0] if isinstance(out, tuple) else out
    out.sum().backward()


@pytest.mark.parametrize("layers", [1, 2])
def test_fused_lstm_counts_the_matmuls_of_its_recurrence_written_by_hand(layers):
    """nn.LSTM on CPU runs aten::mkldnn_rnn_layer (FlopCounterMode: 0); the count equals FlopCounterMode's over
    the same recurrence written with nn.Linear (the fixture's HandLSTM, initial state and input needing grad)."""
    hand_cls = _fixture_module("lstm_lm").HandLSTM
    t, b, n_in, hidden = 7, 3, 12, 20
    x = torch.randn(t, b, n_in, requires_grad=True)
    state = (torch.zeros(layers, b, hidden), torch.zeros(layers, b, hidden))
    lstm = nn.LSTM(n_in, hidden, layers)
    with FlopCounterMode(display=False) as torch_only:
        _fwd_bwd(lstm, x, state)
    mine = FlopCountMode()
    with mine:
        _fwd_bwd(lstm, x, state)
    with FlopCounterMode(display=False) as by_hand:
        _fwd_bwd(hand_cls(n_in, hidden, layers), x, state)
    names = {r["name"] for r in mine.by_op()}
    assert torch_only.get_total_flops() == 0 and "aten::mkldnn_rnn_layer" in names
    assert sum(r["flops"] for r in mine.by_op()) == by_hand.get_total_flops() > 0


@pytest.mark.parametrize(
    ("make", "state"),
    [
        (lambda: nn.LSTM(12, 20, 2, bidirectional=True), lambda: (_h(4, 20), _h(4, 20))),
        (lambda: nn.GRU(12, 20, 2), lambda: _h(2, 20)),
        (lambda: nn.RNN(12, 20, nonlinearity="relu", bidirectional=True), lambda: _h(2, 20)),
        # not oneDNN's: decomposed into matmuls, the projection among them
        (lambda: nn.LSTM(12, 20, proj_size=8), lambda: (_h(1, 8), _h(1, 20))),
    ],
    ids=["lstm-bidirectional", "gru", "rnn-relu", "lstm-proj"],
)
@pytest.mark.filterwarnings("ignore:LSTM with projections")
def test_every_recurrent_layer_counts_three_times_its_forward_matmuls(make, state):
    """Forward: 2 FLOPs per multiply-add of every weight matrix with every token; backward twice that (input
    and initial state need grad, so each matmul has a data and a weight gradient), fused kernel or not."""
    from torchscalpel.runtime.rnn_flops import recurrent_flops

    layer = make()
    x = torch.randn(7, 3, 12, requires_grad=True)
    mine = FlopCountMode()
    with mine:
        _fwd_bwd(layer, x, state())
    assert sum(r["flops"] for r in mine.by_op()) == 3 * recurrent_flops(7 * 3, layer._flat_weights)


def _h(n: int, size: int) -> torch.Tensor:
    return torch.zeros(n, 3, size, requires_grad=True)


@pytest.mark.parametrize("cell", [nn.LSTMCell(12, 20), nn.GRUCell(12, 20), nn.RNNCell(12, 20)], ids=str)
def test_cells_count_their_two_matmuls_forward_and_back(cell):
    x, h = torch.randn(3, 12, requires_grad=True), torch.randn(3, 20, requires_grad=True)
    state = (h, torch.zeros(3, 20)) if isinstance(cell, nn.LSTMCell) else h
    mine = FlopCountMode()
    with mine:
        out = cell(x, state)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    gates = cell.weight_ih.shape[0]
    assert sum(r["flops"] for r in mine.by_op()) == 3 * 2 * 3 * gates * (12 + 20)


def test_cudnn_formula_reads_the_flat_weights_and_the_output_mask():
    """cuDNN's fused op on a GPU: the same count from its flat weight list (a packed input counts its tokens)."""
    from torchscalpel.runtime.rnn_flops import RECURRENT_FORMULAS

    lstm = nn.LSTM(12, 20, 2, bidirectional=True, proj_size=8)
    weights = lstm._flat_weights
    matrices = sum(w.numel() for w in weights if w.dim() == 2)
    x = torch.empty(7, 3, 12, device="meta")
    aten = torch.ops.aten
    forward = RECURRENT_FORMULAS[aten._cudnn_rnn](x, weights, 5, None, None, None, 2, 20, 8, 2, False, 0.0)
    assert forward == 2 * 21 * matrices
    backward = RECURRENT_FORMULAS[aten._cudnn_rnn_backward]
    args = (
        x,
        weights,
        5,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        2,
        20,
        8,
        2,
        False,
        0.0,
        True,
        True,
        [],
        None,
    )
    assert backward(*args, None, [True, True, True, True]) == 2 * forward
    assert backward(*args, None, [True, False, False, False]) == forward  # no weight needs a gradient
    packed = torch.empty(11, 12, device="meta")
    assert RECURRENT_FORMULAS[aten.miopen_rnn](packed, weights) == 2 * 11 * matrices


def test_evaluation_forwards_are_counted_apart():
    model = nn.Linear(16, 8)
    x = torch.randn(4, 16)
    evaluating = [False]
    mine = FlopCountMode(lambda: evaluating[0])
    with mine:
        model(x).sum().backward()
        evaluating[0] = True
        with torch.no_grad():
            model(x)
    forward = 2 * 4 * 16 * 8
    assert sum(r["flops"] for r in mine.by_op()) == 2 * forward  # forward and the weight gradient
    assert sum(mine.evaluation.values()) == forward
    assert sum(r["count"] for r in mine.by_op()) == 2  # the evaluation's call is not the step's


def test_ops_that_may_hold_flops_leave_out_views_syncs_pooling_and_elementwise():
    from torchscalpel.runtime.flop_count import may_hold_flops

    calls = {
        "aten::_sparse_addmm": 2,
        "aten::add_": 9,
        "aten::view": 30,
        "aten::_local_scalar_dense": 1,
        "aten::native_layer_norm": 2,
        "aten::max_pool2d_with_indices": 3,
        "aten::upsample_bilinear2d": 1,
        "aten::softplus": 1,
        "mylib::fused_mlp": 1,
    }
    assert may_hold_flops(calls) == ["aten::_sparse_addmm", "mylib::fused_mlp"]


def test_cpu_attention_counts_as_the_same_attention_written_with_matmuls():
    """F.scaled_dot_product_attention on CPU runs a fused kernel FlopCounterMode has no formula for."""
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    with FlopCounterMode(display=False) as torch_only:
        nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
    mine = FlopCountMode()
    with mine:
        nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
    with FlopCounterMode(display=False) as by_hand:
        weights = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1)
        (weights @ v).sum().backward()
    assert torch_only.get_total_flops() == 0
    # the matmuls by hand, plus the score matmul the flash backward recomputes (torch's formula for the CUDA
    # flash kernel counts the same)
    recomputed_scores = 2 * 2 * 4 * 16 * 16 * 8
    assert sum(r["flops"] for r in mine.by_op()) == by_hand.get_total_flops() + recomputed_scores
    forward = {r["name"]: r["flops"] for r in mine.by_op()}[
        "aten::_scaled_dot_product_flash_attention_for_cpu"
    ]
    assert forward == 2 * recomputed_scores  # QK^T and PV

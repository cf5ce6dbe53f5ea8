"""The issue-32 runtime rules on their own (no script run): what the loss wrappers read, and the in-place
autograd error as script-failed reports it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchscalpel.doctor.rules.rt_loss import LossTaskMismatch, SoftmaxBeforeCrossEntropy, producer
from torchscalpel.doctor.rules.rt_run import Crash, ScriptFailed, _inplace, crash_of
from torchscalpel.findings import Severity
from torchscalpel.record import RunRecord


def _with_rule(rule, fn) -> list:
    undo = rule.setup()
    try:
        fn()
    finally:
        undo()
    assert rule.crashed is None
    return list(rule.findings(None))


def test_producer_looks_through_views_and_casts() -> None:
    x = torch.randn(4, 1, 3, requires_grad=True)
    assert producer(F.softmax(x, -1).squeeze(1).float().view(4, 3)) == "SoftmaxBackward0"
    assert producer(F.log_softmax(x, -1).reshape(4, 3)[:, :2]) == "LogSoftmaxBackward0"
    assert producer((x * 2).softmax(-1) * 1.0) == "MulBackward0"  # scaled probabilities are something else
    assert producer(torch.zeros(2)) is None


def test_sigmoid_into_bce_with_logits_is_an_error_and_logits_are_quiet() -> None:
    w = torch.randn(8, 1, requires_grad=True)
    x, y = torch.randn(16, 8), torch.randint(0, 2, (16, 1)).float()
    (f,) = _with_rule(
        SoftmaxBeforeCrossEntropy(), lambda: F.binary_cross_entropy_with_logits(torch.sigmoid(x @ w), y)
    )
    assert f.severity == Severity.ERROR and "sigmoid" in f.message and "no torch.sigmoid" in f.fix

    def quiet() -> None:
        logits = x @ w
        F.binary_cross_entropy_with_logits(logits, y)
        F.cross_entropy(torch.cat([logits, -logits], 1), y[:, 0].long())
        F.nll_loss(F.log_softmax(torch.cat([logits, -logits], 1), -1), y[:, 0].long())
        with torch.no_grad():  # evaluation on probabilities: no graph, nothing to say
            F.cross_entropy(torch.cat([logits, -logits], 1).softmax(-1), y[:, 0].long())

    assert _with_rule(SoftmaxBeforeCrossEntropy(), quiet) == []


def test_mse_target_that_broadcasts_is_an_error() -> None:
    w = torch.randn(8, 1, requires_grad=True)
    x, y = torch.randn(16, 8), torch.randn(16)

    def train() -> None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about the broadcast too, to stderr only
            F.mse_loss(x @ w, y)

    (f,) = _with_rule(LossTaskMismatch(), train)
    assert f.severity == Severity.ERROR and "broadcast" in f.message and "[16, 16]" in f.evidence[0]
    assert _with_rule(LossTaskMismatch(), lambda: F.mse_loss((x @ w).squeeze(-1), y)) == []


def test_class_indices_read_only_in_training_calls() -> None:
    w = torch.randn(8, 1, requires_grad=True)
    x, y = torch.randn(16, 8), torch.randint(0, 5, (16,)).float()

    def evaluate() -> None:
        with torch.no_grad():
            F.binary_cross_entropy_with_logits((x @ w).squeeze(1), y)

    assert _with_rule(LossTaskMismatch(), evaluate) == []
    (f,) = _with_rule(LossTaskMismatch(), lambda: F.binary_cross_entropy_with_logits((x @ w).squeeze(1), y))
    assert f.severity == Severity.ERROR and "class indices" in f.message


def test_in_place_message_variants_name_the_op_and_versions() -> None:
    out_of = Crash(
        "RuntimeError",
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        "[torch.cuda.HalfTensor [8, 128]], which is output 0 of ReluBackward0, is at version 3; expected "
        "version 2 instead. Hint: ...",
    )
    known = _inplace(out_of, None, [])
    assert known is not None and known.what.startswith("a half tensor [8, 128], output 0 of relu")
    assert "version 3, saved at version 2" in known.what and known.evidence == ()
    leaf = Crash(
        "RuntimeError",
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        "[torch.FloatTensor [4]] is at version 1; expected version 0 instead.",
    )
    known = _inplace(leaf, "MulBackward0 (its saved self)", ["m.py:3: w.add_(1)"])
    assert known is not None and "a float tensor [4] that autograd saved" in known.what
    assert known.evidence == (
        "backward needed it for MulBackward0 (its saved self)",
        "in-place writes in the model's forward: m.py:3: w.add_(1)",
    )
    assert _inplace(Crash("ValueError", leaf.message), None, []) is None


def test_script_failed_reads_the_failed_graph_for_the_node_that_needed_the_tensor() -> None:
    rule = ScriptFailed()
    w = torch.randn(3, requires_grad=True)
    h = torch.exp(w)  # exp saves its result
    loss = h.sum()
    h.mul_(2)
    rule.on_backward_pre((loss,))
    try:
        loss.backward()
    except RuntimeError as exc:
        rule.on_script_error(exc)
    (f,) = rule.findings(RunRecord(status="failed", error="RuntimeError: ..."))
    assert (
        "output 0 of exp" in f.message
        and "backward needed it for ExpBackward0 (its saved result)" in f.evidence
    )
    assert crash_of(RuntimeError("x")).location is None


def test_mse_on_whole_numbers_zero_to_k_without_a_loader_is_class_indices() -> None:
    w = torch.randn(8, 1, requires_grad=True)
    x = torch.randn(64, 8)
    labels = torch.arange(64) % 4  # classes 0..3

    def train(targets) -> None:
        for i in range(0, 64, 16):
            F.mse_loss((x[i : i + 16] @ w).squeeze(-1), targets[i : i + 16])

    (f,) = _with_rule(LossTaskMismatch(), lambda: train(labels.float()))
    assert "whole numbers 0 .. 3" in f.evidence[0] and f.severity == Severity.WARNING
    # ratings 1..5 and real-valued targets are regression targets
    assert _with_rule(LossTaskMismatch(), lambda: train((labels + 1).float())) == []
    assert _with_rule(LossTaskMismatch(), lambda: train(labels.float() + 0.5)) == []


def test_mse_on_integer_tensors_needs_labels_zero_to_k() -> None:
    w = torch.randn(8, 1, requires_grad=True)
    x = torch.randn(64, 8)

    def train(targets) -> None:
        for i in range(0, 64, 16):
            F.mse_loss((x[i : i + 16] @ w).squeeze(-1), targets[i : i + 16])

    (f,) = _with_rule(LossTaskMismatch(), lambda: train(torch.arange(64) % 2))  # int64 0/1 labels
    assert "(int64 targets)" in f.evidence[0]
    assert _with_rule(LossTaskMismatch(), lambda: train(torch.arange(64) % 5 + 1)) == []  # ratings 1..5

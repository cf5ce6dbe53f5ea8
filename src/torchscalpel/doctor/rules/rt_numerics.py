"""Runtime numerics rules on the loss: non-finite (with its origin), diverging, constant. The gradient rules
are in :mod:`torchscalpel.doctor.rules.rt_grads`."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc, median
from torchscalpel.doctor.runtime_rules import RuntimeRule, iter_tensors, user_location
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr

MAX_CHECKED_STEPS = 500
"""Module outputs are checked for NaN/inf during at most this many steps (cost bound)."""
NONFINITE_GRADS = "Gradients became non-finite (inf/NaN) at an optimizer step."
"""The message of the ``grad-norm-explosion`` finding for non-finite gradients (see :meth:`NanLoss.redundant`)."""


def _nonfinite(t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.numel() > 0 and not bool(torch.isfinite(t.detach()).all())


def _module_names(roots: Any) -> dict[int, str]:
    names: dict[int, str] = {}
    for root in list(roots or ()):
        for name, m in root.named_modules():
            names.setdefault(id(m), f"{type(root).__name__}.{name}" if name else type(root).__name__)
    return names


NAN_LOSS = RuleInfo(
    slug="nan-loss",
    severity=Severity.ERROR,
    category="numerics",
    summary="the loss became NaN/inf; names the first op and module that produced it",
    kinds=("runtime",),
)


class NanLoss(RuntimeRule):
    """The first step whose loss is NaN/inf, and the first module whose output went non-finite from finite inputs."""

    info = NAN_LOSS
    supersedes = ("grad-norm-explosion",)
    """Only its non-finite-gradients finding (see :meth:`redundant`)."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self.first_step: int | None = None
        self.loss_value: float | None = None
        self.nonfinite_steps = 0
        self.origin: dict[str, Any] | None = None
        self.location: Location | None = None
        self.op_origin: dict[str, Any] | None = None
        """Filled by the anomaly/dispatch re-run (see torchscalpel.doctor.nan_trace)."""

    @classmethod
    def redundant(cls, findings: Sequence[Finding]) -> list[Finding]:
        """Non-finite gradients are the NaN loss's own consequence; an explosion with finite gradients is not."""
        if not any(f.rule == "nan-loss" for f in findings):
            return []
        return [
            f for f in findings if f.rule == "grad-norm-explosion" and f.message.startswith(NONFINITE_GRADS)
        ]

    def rerun_steps(self) -> int | None:
        """Steps a re-run needs to reach the first non-finite loss (None: the loss stayed finite)."""
        return None if self.first_step is None else max(1, self.first_step + 1)

    def set_op_origin(self, origin: dict[str, Any]) -> None:
        """Record the first op that produced a non-finite value, found by the re-run (its ``op``, ``location``, ``backward``)."""
        self.op_origin = origin

    def on_forward_post(
        self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any, root: bool
    ) -> None:
        if self.origin is not None or self.step >= MAX_CHECKED_STEPS:
            return
        outs = [t for t in iter_tensors(output, limit=4) if _nonfinite(t)]
        if not outs:
            return
        if any(_nonfinite(t) for t in iter_tensors(args, limit=8)):
            return  # inherited from its input: not where it started
        bad_params = [n for n, p in module.named_parameters(recurse=False) if _nonfinite(p)]
        name = _module_names(getattr(self.session, "root_modules", ())).get(id(module), type(module).__name__)
        self.origin = {
            "module": name,
            "type": type(module).__name__,
            "step": self.step,
            "bad_params": bad_params,
            "grad_enabled": torch.is_grad_enabled(),
        }

    def on_backward_pre(self, tensors: Any) -> None:
        if not tensors or not isinstance(tensors[0], torch.Tensor):
            return
        if _nonfinite(tensors[0]):
            self.nonfinite_steps += 1
            if self.first_step is None:
                self.first_step = self.step
                self.loss_value = float(tensors[0].detach().float().mean())
                self.location = user_location()

    def on_optimizer_step_post(self, optimizer: Any) -> None:
        self.step += 1

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.first_step is None:
            return
        evidence = [
            f"loss = {self.loss_value} first at step {self.first_step}; non-finite at {self.nonfinite_steps} backward call(s)"
        ]
        origin_text = "outside any module (in the loss computation or the training loop)"
        if self.origin is not None and self.origin["step"] <= self.first_step:
            o = self.origin
            origin_text = f"in module {o['module']} ({o['type']})"
            detail = f"first non-finite output: {o['module']} ({o['type']}) at step {o['step']}, from finite inputs"
            if o["bad_params"]:
                detail += f"; its own parameters {', '.join(o['bad_params'])} were already non-finite (a bad update)"
            evidence.append(detail)
        if self.op_origin:
            op = self.op_origin
            where = f" at {fmt_loc(op['location'])}" if op.get("location") else ""
            evidence.append(
                f"first op producing non-finite values: {op['op']}{' (backward)' if op.get('backward') else ''}{where} (re-run up to that step)"
            )
            origin_text = f"by {op['op']}{where}"
        loc = (self.op_origin or {}).get("location") or self.location
        yield NAN_LOSS.finding(
            f"The loss became non-finite at step {self.first_step}, first produced {origin_text}.",
            evidence=[*evidence, f"backward called at {fmt_loc(self.location)}"],
            fix="# guard the op that produced it, e.g.\nlogp = torch.log(p.clamp_min(1e-12))   # or F.log_softmax instead of log(softmax)\n"
            "# and check the learning rate; clip gradients:\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
            location=loc,
        )


LOSS_DIVERGING = RuleInfo(
    slug="loss-diverging",
    severity=Severity.WARNING,
    category="numerics",
    summary="the loss grows instead of falling, or blows up",
    kinds=("runtime",),
)


class LossDiverging(RuntimeRule):
    """The loss goes up: a rising trend, or a blow-up (one step 100x above where the run started).

    Decided on step counts and loss values only (never on time). The baseline is where the run
    started, ``min(first loss, median of the first fifth)``, so a blow-up in the first steps cannot
    become the "normal" level it is compared with; a script that crashed after the blow-up keeps the
    steps it ran.
    """

    info = LOSS_DIVERGING
    supersedes = ("vanishing-gradients",)
    """Weights thrown far away kill activations: the zero/vanishing gradients that follow are the
    blow-up's consequence, and its fix (the learning rate) is the one that helps."""
    MIN_STEPS = 6
    FACTOR = 2.0
    BLOWUP = 100.0
    """One step's loss this many times the baseline is a blow-up, however short the run."""

    def findings(self, record: Any) -> Iterator[Finding]:
        losses = [s.loss for s in (record.steps if record is not None else []) if s.loss is not None]
        finite = [x for x in losses if math.isfinite(x)]
        went_nonfinite = len(finite) < len(losses)
        if len(finite) < 2:
            return
        k = max(2, len(finite) // 5) if len(finite) >= self.MIN_STEPS else 1
        base = min(finite[0], median(finite[:k]))
        last = median(finite[-k:])
        peak_i = max(range(1, len(finite)), key=finite.__getitem__)
        peak = finite[peak_i]
        blowup = base > 0 and peak >= self.BLOWUP * base and peak >= 1.0
        # A trend needs enough steps; a short finite run that ends in NaN/inf must have grown 10x first.
        factor = self.FACTOR if len(finite) >= self.MIN_STEPS else 10.0
        rising = (len(finite) >= self.MIN_STEPS or went_nonfinite) and last - base > (factor - 1.0) * max(
            abs(base), 1e-8
        )
        if not (blowup or rising):
            return
        crashed = record is not None and getattr(record, "status", "") == "failed"
        if blowup and not rising:
            message = (
                f"The loss blew up: {base:.4g} at the start, {peak:.4g} at step {peak_i} ({peak / base:.0f}x)"
                + (
                    "; it then became non-finite."
                    if went_nonfinite
                    else "; the script then crashed."
                    if crashed
                    else f", and {last:.4g} at the end."
                    if peak_i < len(finite) - 1
                    else "."
                )
            )
        else:
            message = (
                f"The loss rises instead of falling: {base:.4g} at the start, median {last:.4g} over the last {k} steps"
                + (f" (peak {peak:.4g})" if blowup else "")
                + (" before it became non-finite." if went_nonfinite else ".")
            )
        evidence = [
            f"loss at steps 0..{len(finite) - 1}: " + ", ".join(f"{x:.3g}" for x in _sample(finite)),
            f"max {peak:.4g} at step {peak_i}; baseline (first steps, blow-ups excluded) {base:.4g}",
        ]
        if crashed and record.error:
            evidence.append(f"the script then failed: {str(record.error).splitlines()[0][:200]}")
        yield LOSS_DIVERGING.finding(
            message,
            evidence=evidence,
            fix="# the learning rate is too high for this optimizer (typical: AdamW 1e-4..3e-3, SGD 1e-3..1e-1);\n"
            "# lower it 10x, add warm-up and clipping:\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=lr / 10)\n"
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)",
        )


def _sample(values: Sequence[float], n: int = 12) -> list[float]:
    """About ``n`` values spread over ``values``, always with the first ones (where blow-ups show) and the last."""
    if len(values) <= n:
        return list(values)
    stride = max(1, len(values) // (n - 3))
    picked = sorted({0, 1, 2, *range(0, len(values), stride), len(values) - 1})
    return [values[i] for i in picked]


_SINGLE_CLASS = "cross_entropy/nll_loss over a single class"


LOSS_CONSTANT = RuleInfo(
    slug="loss-constant",
    severity=Severity.ERROR,
    category="numerics",
    summary="the loss is the same value at every step: nothing can learn",
    kinds=("runtime",),
)


class ConstantLoss(RuntimeRule):
    """The loss has exactly the same value at every step: it cannot vary with the parameters.

    Typical cause, named when seen: ``cross_entropy`` over one logit (``nn.Linear(d, 1)`` with
    ``CrossEntropyLoss`` and float targets) is ``-target * log(softmax([z]))`` = 0 for every ``z``.
    """

    info = LOSS_CONSTANT
    supersedes = ("vanishing-gradients", "cannot-overfit-batch")
    """Zero gradients and parameters that never move are this finding's consequences."""
    MIN_STEPS = 5

    def __init__(self) -> None:
        super().__init__()
        self.single_class: dict[str, Any] | None = None

    def setup(self) -> Undo:
        import torch.nn.functional as F

        rule = self

        def seen(input: Any) -> None:
            if (
                rule.single_class is None
                and isinstance(input, torch.Tensor)
                and input.dim() >= 2
                and input.shape[1] == 1
                and input.requires_grad
            ):
                rule.single_class = {"shape": list(input.shape), "location": user_location()}

        safe_seen = self.safe(seen)

        def make(original: Any) -> Any:
            def loss_fn(input: Any, *args: Any, **kwargs: Any) -> Any:
                # Inside a compiled region (nanoGPT computes its loss in forward) dynamo would trace the
                # check and break the graph at the stack walk: only eager calls are looked at.
                if not torch.compiler.is_compiling():
                    safe_seen(input)
                return original(input, *args, **kwargs)

            return loss_fn

        # nll_loss too: F.nll_loss(F.log_softmax(out, 1), y) over one class is just as constant
        return undo_all([wrap_attr(F, "cross_entropy", make), wrap_attr(F, "nll_loss", make)])

    def findings(self, record: Any) -> Iterator[Finding]:
        losses = [s.loss for s in (record.steps if record is not None else []) if s.loss is not None]
        if len(losses) < self.MIN_STEPS or not all(math.isfinite(x) for x in losses) or len(set(losses)) != 1:
            return
        value = losses[0]
        sc = self.single_class
        if sc is not None:
            cause = (
                f"{_SINGLE_CLASS}: the model's output has shape {sc['shape']}, one logit per sample, and softmax "
                "over one logit is always 1, so the loss is 0 whatever the model predicts"
            )
            fix = (
                "# one output unit is binary classification: use a loss made for it\n"
                "criterion = nn.BCEWithLogitsLoss()          # targets: float 0/1, shape like the output\n"
                "# or two output units with integer class targets:\n"
                "# model = ...nn.Linear(d, 2); loss = F.cross_entropy(logits, y.long().view(-1))"
            )
        else:
            cause = "it does not depend on the model's output (a detached or constant term, a loss over a single class, ...)"
            fix = (
                "# compute the loss from the model's output without .detach()/.item()/argmax in between,\n"
                "# and check the output layer matches the loss:\n"
                "loss = F.cross_entropy(model(x), y)   # logits of shape (N, classes), integer targets"
            )
        yield LOSS_CONSTANT.finding(
            f"The loss is exactly {value:.6g} at every one of the {len(losses)} steps: it cannot vary, because {cause}. "
            "Nothing can learn.",
            evidence=[f"{len(losses)} steps, every loss bit-identical ({value!r})"]
            + (
                [f"cross_entropy called with input of shape {sc['shape']} at {fmt_loc(sc['location'])}"]
                if sc
                else []
            ),
            fix=fix,
            location=sc["location"] if sc else None,
        )

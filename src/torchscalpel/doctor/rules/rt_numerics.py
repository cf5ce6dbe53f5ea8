"""Runtime numerics rules: non-finite loss (with its origin), diverging loss, exploding and vanishing gradients."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torchscalpel.doctor.finding import Finding, Location, Severity
from torchscalpel.doctor.registry import make_finding
from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc, median, param_names
from torchscalpel.doctor.runtime_rules import RuntimeRule, iter_tensors, user_location

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


class NanLoss(RuntimeRule):
    """The first step whose loss is NaN/inf, and the first module whose output went non-finite from finite inputs."""

    info = RuleInfo(
        slug="nan-loss",
        severity=Severity.ERROR,
        category="numerics",
        summary="the loss became NaN/inf; names the first op and module that produced it",
        kinds=("runtime",),
    )
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
        return [f for f in findings if f.rule == "grad-norm-explosion" and f.message.startswith(NONFINITE_GRADS)]

    def rerun_steps(self) -> int | None:
        """Steps a re-run needs to reach the first non-finite loss (None: the loss stayed finite)."""
        return None if self.first_step is None else max(1, self.first_step + 1)

    def set_op_origin(self, origin: dict[str, Any]) -> None:
        """Record the first op that produced a non-finite value, found by the re-run (its ``op``, ``location``, ``backward``)."""
        self.op_origin = origin

    def on_forward_post(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any, root: bool) -> None:
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
        evidence = [f"loss = {self.loss_value} first at step {self.first_step}; non-finite at {self.nonfinite_steps} backward call(s)"]
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
            evidence.append(f"first op producing non-finite values: {op['op']}{' (backward)' if op.get('backward') else ''}{where} (re-run up to that step)")
            origin_text = f"by {op['op']}{where}"
        loc = (self.op_origin or {}).get("location") or self.location
        yield make_finding(
            "nan-loss",
            f"The loss became non-finite at step {self.first_step}, first produced {origin_text}.",
            evidence=[*evidence, f"backward called at {fmt_loc(self.location)}"],
            fix="# guard the op that produced it, e.g.\nlogp = torch.log(p.clamp_min(1e-12))   # or F.log_softmax instead of log(softmax)\n"
            "# and check the learning rate; clip gradients:\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
            location=loc,
        )


class LossDiverging(RuntimeRule):
    """The loss trend goes up: the last fifth of the steps sits well above the first fifth."""

    info = RuleInfo(
        slug="loss-diverging",
        severity=Severity.WARNING,
        category="numerics",
        summary="the loss grows instead of falling",
        kinds=("runtime",),
    )
    MIN_STEPS = 6
    FACTOR = 2.0

    def findings(self, record: Any) -> Iterator[Finding]:
        losses = [s.loss for s in (record.steps if record is not None else []) if s.loss is not None]
        finite = [x for x in losses if math.isfinite(x)]
        went_nonfinite = len(finite) < len(losses)
        if len(finite) < self.MIN_STEPS and not (went_nonfinite and len(finite) >= 3):
            return
        k = max(2, len(finite) // 5) if len(finite) >= self.MIN_STEPS else 1
        first, last = median(finite[:k]), median(finite[-k:])
        # A short finite run that ends in NaN/inf must have blown up by an order of magnitude first.
        factor = self.FACTOR if len(finite) >= self.MIN_STEPS else 10.0
        rising = last - first > (factor - 1.0) * max(abs(first), 1e-8)
        if not rising:
            return
        yield make_finding(
            "loss-diverging",
            f"The loss rises instead of falling: median {first:.4g} over the first {k} steps, {last:.4g} over the last {k}"
            + (" before it became non-finite." if went_nonfinite else "."),
            evidence=[f"loss at steps 0..{len(finite) - 1}: " + ", ".join(f"{x:.3g}" for x in finite[:: max(1, len(finite) // 10)]),
                      f"max {max(finite):.4g}"],
            fix="# lower the learning rate (typically 3-10x) and add warm-up and clipping:\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=lr / 10)\n"
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)",
        )


class GradNorms(RuntimeRule):
    """Gradient norms at each optimizer step: explosion (growth) and vanishing (early layers starved)."""

    infos = (
        RuleInfo(
            slug="grad-norm-explosion",
            severity=Severity.WARNING,
            category="numerics",
            summary="the gradient norm explodes",
            kinds=("runtime",),
        ),
        RuleInfo(
            slug="vanishing-gradients",
            severity=Severity.WARNING,
            category="numerics",
            summary="early layers get gradients orders of magnitude smaller than late ones",
            kinds=("runtime",),
        ),
    )
    MAX_STEPS = 200
    EXPLOSION_RATIO = 100.0
    VANISH_RATIO = 1e-3  # clean CNN/transformer runs sit near 0.3-0.6; sigmoid stacks far below

    def __init__(self) -> None:
        super().__init__()
        self.norms: list[float] = []
        self.ratios: list[float] = []
        self.layers: tuple[str, str] | None = None
        self.zero_steps = 0
        self.location: Location | None = None

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if len(self.norms) >= self.MAX_STEPS:
            return
        grads = [(p, _local(p.grad)) for g in optimizer.param_groups for p in g["params"] if p.grad is not None and not p.grad.is_sparse]
        if not grads:
            return
        sq = torch.stack([g.detach().float().pow(2).sum() for _, g in grads])
        total = float(sq.sum().sqrt())
        self.norms.append(total)
        if self.location is None:
            self.location = user_location()
        if total == 0.0:
            self.zero_steps += 1
        weights = [(p, math.sqrt(float(s)) / math.sqrt(max(1, p.numel()))) for (p, _), s in zip(grads, sq.tolist(), strict=True) if p.dim() >= 2 and not _is_embedding(p, self)]
        if len(weights) >= 3 and math.isfinite(total) and total > 0:
            # Medians over the first and last third of the weight matrices: one layer with small gradients
            # at init (attention query/key weights) is normal; a whole early third starved is not.
            rms = [r for _, r in weights]
            k = max(1, len(rms) // 3)
            early, late = median(rms[:k]), median(rms[-k:])
            if late > 0:
                self.ratios.append(early / late)
                if self.layers is None:
                    names = param_names(getattr(self.session, "root_modules", ()) or ())
                    self.layers = (f"first {k} weight(s) from {names.get(id(weights[0][0]), 'the first layer')}",
                                   f"last {k} up to {names.get(id(weights[-1][0]), 'the last layer')}")

    def findings(self, record: Any) -> Iterator[Finding]:
        yield from self._explosion()
        yield from self._vanishing()

    def _explosion(self) -> Iterator[Finding]:
        norms = self.norms
        if len(norms) < 4:
            return
        finite = [x for x in norms if math.isfinite(x)]
        base = median(finite[:3]) if len(finite) >= 3 else float("nan")
        nonfinite = len(finite) < len(norms)
        peak = max(finite) if finite else float("nan")
        exploded = base > 0 and peak / base >= self.EXPLOSION_RATIO
        if not (exploded or nonfinite):
            return
        shown = ", ".join(f"{x:.3g}" for x in norms[:: max(1, len(norms) // 10)])
        yield make_finding(
            "grad-norm-explosion",
            f"The gradient norm explodes: {peak / base:.0f}x its early value" if exploded and not nonfinite
            else NONFINITE_GRADS,
            evidence=[f"total grad norm over {len(norms)} steps: {shown}", f"early median {base:.3g}, peak {peak:.3g}",
                      f"optimizer step at {fmt_loc(self.location)}"],
            fix="loss.backward()\ntorch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\noptimizer.step()\n"
            "# and/or lower the learning rate",
            location=self.location,
        )

    def _vanishing(self) -> Iterator[Finding]:
        if len(self.norms) >= 3 and self.zero_steps >= max(3, len(self.norms) // 2):
            yield make_finding(
                "vanishing-gradients",
                "Gradients are exactly zero: nothing upstream of the loss learns (dead activations or a detached graph).",
                evidence=[f"total grad norm was 0 at {self.zero_steps} of {len(self.norms)} optimizer steps"],
                fix="# check for .detach()/.item()/argmax between model and loss, and saturated activations",
                location=self.location,
            )
            return
        if len(self.ratios) < 3:
            return
        r = median(self.ratios)
        if r >= self.VANISH_RATIO:
            return
        first, top = self.layers or ("first weights", "last weights")
        yield make_finding(
            "vanishing-gradients",
            f"Early layers get gradients {1 / r:.0e}x smaller than later ones: they barely learn.",
            evidence=[f"median RMS gradient of the {first} / of the {top} = {r:.2e} over {len(self.ratios)} steps"],
            fix="# use ReLU/GELU instead of sigmoid/tanh stacks, normalisation layers, residual connections,\n"
            "# and a suitable init, e.g. nn.init.kaiming_normal_(layer.weight, nonlinearity='relu')",
            location=self.location,
        )


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2 gradients), else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _is_embedding(p: torch.Tensor, rule: RuntimeRule) -> bool:
    """True for weights of embedding layers (sparse rows per batch: tiny RMS gradients are normal)."""
    cache = getattr(rule, "_embedding_ids", None)
    if cache is None:
        cache = set()
        for root in list(getattr(rule.session, "root_modules", ()) or ()):
            for m in root.modules():
                if isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag):
                    cache.update(id(q) for q in m.parameters())
        rule._embedding_ids = cache  # type: ignore[attr-defined]
    return id(p) in cache


class NoUpdate(RuntimeRule):
    """Optimizer steps that never change the parameters (zero learning rate, gradients cleared before the
    step, a detached loss): the model cannot learn anything, not even one batch."""

    info = RuleInfo(
        slug="cannot-overfit-batch",
        severity=Severity.WARNING,
        category="numerics",
        summary="the model cannot overfit a single batch (--sanity)",
        kinds=("runtime",),
    )
    MIN_STEPS = 5
    SAMPLE = 8

    def __init__(self) -> None:
        super().__init__()
        self._before: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.steps = 0
        self.unchanged = 0
        self.location: Location | None = None

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        # Spread over the whole model, last layer included: early layers may legitimately barely move.
        params = [*params[:: max(1, len(params) // self.SAMPLE)], *params[-1:]]
        self._before = [(p, _local(p.detach()).reshape(-1)[:64].clone()) for p in params if p.numel()]

    def on_optimizer_step_post(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._before:
            return
        self.steps += 1
        if all(torch.equal(_local(p.detach()).reshape(-1)[:64], old) for p, old in self._before):
            self.unchanged += 1
            self.location = self.location or user_location()
        self._before = []

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.steps < self.MIN_STEPS or self.unchanged < self.steps:
            return
        yield make_finding(
            "cannot-overfit-batch",
            f"None of the {self.steps} optimizer steps changed the parameters: the model cannot learn, not even "
            "one batch.",
            evidence=[f"sampled parameters were bit-identical before and after all {self.steps} optimizer.step() calls",
                      f"optimizer step at {fmt_loc(self.location)}"],
            fix="# check: zero_grad() must come before backward(), not between backward() and step();\n"
            "# the learning rate (and scheduler) must be > 0; the loss must depend on the model's output\n"
            "optimizer.zero_grad(); loss.backward(); optimizer.step()",
            location=self.location,
        )

"""Runtime gradient rules: exploding and vanishing gradient norms, and parameters that never update."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc, median, param_names
from torchscalpel.doctor.rules.rt_numerics import NONFINITE_GRADS
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location, Severity

GRAD_NORM_EXPLOSION = RuleInfo(
    slug="grad-norm-explosion",
    severity=Severity.WARNING,
    category="numerics",
    summary="the gradient norm explodes",
    kinds=("runtime",),
)


VANISHING_GRADIENTS = RuleInfo(
    slug="vanishing-gradients",
    severity=Severity.WARNING,
    category="numerics",
    summary="early layers get gradients orders of magnitude smaller than late ones",
    kinds=("runtime",),
)


class GradNorms(RuntimeRule):
    """Gradient norms at each optimizer step: explosion (growth) and vanishing (early layers starved)."""

    infos = (GRAD_NORM_EXPLOSION, VANISHING_GRADIENTS)
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
        grads = [
            (p, _local(p.grad))
            for g in optimizer.param_groups
            for p in g["params"]
            if p.grad is not None and not p.grad.is_sparse
        ]
        if not grads:
            return
        sq = torch.stack([g.detach().float().pow(2).sum() for _, g in grads])
        total = float(sq.sum().sqrt())
        self.norms.append(total)
        if self.location is None:
            self.location = user_location()
        if total == 0.0:
            self.zero_steps += 1
        weights = [
            (p, math.sqrt(float(s)) / math.sqrt(max(1, p.numel())))
            for (p, _), s in zip(grads, sq.tolist(), strict=True)
            if p.dim() >= 2 and not _is_embedding(p, self)
        ]
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
                    self.layers = (
                        f"first {k} weight(s) from {names.get(id(weights[0][0]), 'the first layer')}",
                        f"last {k} up to {names.get(id(weights[-1][0]), 'the last layer')}",
                    )

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
        yield GRAD_NORM_EXPLOSION.finding(
            f"The gradient norm explodes: {peak / base:.0f}x its early value"
            if exploded and not nonfinite
            else NONFINITE_GRADS,
            evidence=[
                f"total grad norm over {len(norms)} steps: {shown}",
                f"early median {base:.3g}, peak {peak:.3g}",
                f"optimizer step at {fmt_loc(self.location)}",
            ],
            fix="loss.backward()\ntorch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\noptimizer.step()\n"
            "# and/or lower the learning rate",
            location=self.location,
        )

    def _vanishing(self) -> Iterator[Finding]:
        if len(self.norms) >= 3 and self.zero_steps >= max(3, len(self.norms) // 2):
            first_zero = next(i for i, x in enumerate(self.norms) if x == 0.0)
            died = first_zero > 0 and all(x > 0 for x in self.norms[:first_zero])
            if died:  # the network learned, then went dead: large updates killed the units
                message = (
                    f"Gradients were non-zero for the first {first_zero} optimizer step(s), then exactly zero at "
                    "most steps: the units died after large updates, so nothing learns any more."
                )
                fix = (
                    "# the learning rate is too high for this optimizer: lower it 10x, add warm-up and clipping\n"
                    "optimizer = torch.optim.AdamW(model.parameters(), lr=lr / 10)\n"
                    "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)"
                )
            else:
                message = (
                    "Gradients are exactly zero at most optimizer steps: nothing upstream of the loss learns "
                    "(dead activations or a detached graph)."
                )
                fix = "# check for .detach()/.item()/argmax between model and loss, and saturated activations"
            yield VANISHING_GRADIENTS.finding(
                message,
                evidence=[
                    f"total grad norm was 0 at {self.zero_steps} of {len(self.norms)} optimizer steps"
                    + (
                        f", from step {first_zero} on; before it: "
                        + ", ".join(f"{x:.3g}" for x in self.norms[: min(first_zero, 5)])
                        if died
                        else ""
                    )
                ],
                fix=fix,
                location=self.location,
                severity=Severity.ERROR,  # training that cannot learn at all
            )
            return
        if len(self.ratios) < 3:
            return
        r = median(self.ratios)
        if r >= self.VANISH_RATIO:
            return
        first, top = self.layers or ("first weights", "last weights")
        yield VANISHING_GRADIENTS.finding(
            f"Early layers get gradients {1 / r:.0e}x smaller than later ones: they barely learn.",
            evidence=[
                f"median RMS gradient of the {first} / of the {top} = {r:.2e} over {len(self.ratios)} steps"
            ],
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


CANNOT_OVERFIT_BATCH = RuleInfo(
    slug="cannot-overfit-batch",
    severity=Severity.WARNING,
    category="numerics",
    summary="the model cannot overfit a single batch (--sanity)",
    kinds=("runtime",),
)


class NoUpdate(RuntimeRule):
    """Optimizer steps that never change the parameters (zero learning rate, gradients cleared before the
    step, a detached loss): the model cannot learn anything, not even one batch."""

    info = CANNOT_OVERFIT_BATCH
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
        yield CANNOT_OVERFIT_BATCH.finding(
            f"None of the {self.steps} optimizer steps changed the parameters: the model cannot learn, not even "
            "one batch.",
            evidence=[
                f"sampled parameters were bit-identical before and after all {self.steps} optimizer.step() calls",
                f"optimizer step at {fmt_loc(self.location)}",
            ],
            fix="# check: zero_grad() must come before backward(), not between backward() and step();\n"
            "# the learning rate (and scheduler) must be > 0; the loss must depend on the model's output\n"
            "optimizer.zero_grad(); loss.backward(); optimizer.step()",
            location=self.location,
            severity=Severity.ERROR,  # not one parameter moved: training cannot learn at all
        )

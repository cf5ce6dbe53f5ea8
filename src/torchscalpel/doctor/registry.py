"""The rule registry: every doctor rule's stable slug, default severity, category and one-line summary.

The slugs are a contract (JSON and SARIF carry them as ``rule``); add rules, never rename them.
:func:`guarded` runs one rule's code so that a crash becomes that rule's internal-error finding
instead of ending the run or silencing the other rules.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from torchscalpel.doctor.finding import Finding, Location, Severity

E = Severity.ERROR
W = Severity.WARNING
I = Severity.INFO  # noqa: E741 - reads as a table below


@dataclass(frozen=True, slots=True)
class RuleInfo:
    """What every rule declares: slug, default severity, category and a one-line summary."""

    slug: str
    severity: Severity
    category: str
    summary: str
    kinds: tuple[str, ...]
    """``static`` and/or ``runtime``: where the rule looks."""


_TABLE: tuple[tuple[str, Severity, str, str, str], ...] = (
    # Model and parameters
    ("module-in-plain-container", E, "model", "nn.Module held in a plain list/dict/tuple: its parameters are not registered", "static,runtime"),
    ("tensor-attribute-not-registered", W, "model", "tensor attribute that is neither parameter nor buffer: not moved by .to(), not saved", "static,runtime"),
    ("module-created-in-forward", E, "model", "module constructed inside forward: fresh random weights every call, never trained", "static,runtime"),
    ("param-not-in-optimizer", E, "model", "trainable parameters that receive gradients but no optimizer updates", "runtime"),
    ("frozen-param-in-optimizer", W, "model", "requires_grad turned off after the optimizer was built", "runtime"),
    # Training loop
    ("grad-not-zeroed", E, "loop", "gradients accumulate across optimizer steps (never cleared)", "runtime"),
    ("loss-graph-retained", W, "loop", "loss/output tensors with autograd graphs kept alive across steps", "runtime"),
    ("eval-in-train-mode", W, "loop", "forward under no_grad/inference_mode with dropout or batch-norm in training mode", "runtime"),
    ("eval-without-no-grad", W, "loop", "forward passes whose autograd graph is never used", "runtime"),
    ("train-loader-not-shuffled", W, "loop", "the training DataLoader reads samples in a fixed order", "runtime"),
    ("nan-loss", E, "numerics", "the loss became NaN/inf; names the first op and module that produced it", "runtime"),
    ("loss-diverging", W, "numerics", "the loss grows instead of falling", "runtime"),
    ("grad-norm-explosion", W, "numerics", "the gradient norm explodes", "runtime"),
    ("vanishing-gradients", W, "numerics", "early layers get gradients orders of magnitude smaller than late ones", "runtime"),
    ("cannot-overfit-batch", W, "numerics", "the model cannot overfit a single batch (--sanity)", "runtime"),
    # Mixed precision
    ("clip-before-unscale", E, "amp", "gradient clipping on scaled gradients (before scaler.unscale_)", "runtime"),
    ("scaler-skipped-steps", W, "amp", "GradScaler skipped optimizer steps", "runtime"),
    # Performance
    ("dataloader-bound", W, "performance", "data wait is at least 30% of step time", "runtime"),
    ("host-device-copy-bound", W, "performance", "host-device copies take at least 15% of step time", "runtime"),
    ("empty-cache-in-loop", W, "performance", "torch.cuda.empty_cache() called every step", "static,runtime"),
    ("cudnn-benchmark-dynamic-shapes", W, "performance", "cudnn.benchmark with input shapes that keep changing", "runtime"),
    ("compile-graph-breaks", W, "performance", "torch.compile graph breaks", "runtime"),
    ("compile-recompiles", W, "performance", "torch.compile recompiles after warm-up", "runtime"),
    # Distributed
    ("ddp-batchnorm-not-synced", W, "distributed", "BatchNorm under DDP without SyncBatchNorm", "runtime"),
    ("ddp-no-distributed-sampler", E, "distributed", "ranks read the same samples (no DistributedSampler)", "runtime"),
    ("sampler-set-epoch-missing", W, "distributed", "DistributedSampler.set_epoch never called: same order every epoch", "static,runtime"),
    ("ddp-find-unused-parameters", W, "distributed", "find_unused_parameters set without need, or missing when needed", "runtime"),
    ("rank-conditional-step", E, "distributed", "backward, optimizer step or a collective run only on some ranks", "static,runtime"),
    ("dataparallel-used", W, "distributed", "nn.DataParallel is slower than DDP and deprecated in spirit", "static,runtime"),
    ("optimizer-before-fsdp", E, "distributed", "optimizer built before fully_shard: it holds the unsharded parameters", "static,runtime"),
    # Checkpoints
    ("unsafe-torch-load", W, "checkpoint", "torch.load with weights_only=False (or pickle) runs arbitrary code", "static,runtime"),
    ("whole-model-save", W, "checkpoint", "torch.save of a whole nn.Module instead of its state_dict", "static,runtime"),
    ("state-dict-prefix-mismatch", E, "checkpoint", "state_dict keys differ by a module./_orig_mod. prefix", "runtime"),
    # Reproducibility
    ("unseeded-run", I, "reproducibility", "no random seed is set", "static,runtime"),
)

RULES: dict[str, RuleInfo] = {
    slug: RuleInfo(slug=slug, severity=sev, category=cat, summary=summary, kinds=tuple(kinds.split(",")))
    for slug, sev, cat, summary, kinds in _TABLE
}
"""All rules by slug, in documentation order."""


def rule_info(slug: str) -> RuleInfo:
    """The :class:`RuleInfo` of ``slug`` (KeyError for an unknown slug: a programming error)."""
    return RULES[slug]


def make_finding(
    slug: str,
    message: str,
    *,
    evidence: Iterable[str] = (),
    fix: str = "",
    location: Location | None = None,
    source: str = "runtime",
    severity: Severity | None = None,
) -> Finding:
    """A :class:`Finding` for registered rule ``slug`` with its default severity unless overridden."""
    info = RULES[slug]
    return Finding(
        rule=slug,
        severity=info.severity if severity is None else severity,
        message=message,
        evidence=list(evidence),
        fix=fix,
        location=location,
        source=source,
    )


def internal_error(slug: str, exc: BaseException, *, source: str = "runtime") -> Finding:
    """The finding that stands in for rule ``slug`` when its own code crashed (severity info)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "unknown"
    return Finding(
        rule=slug,
        severity=Severity.INFO,
        message=f"internal error in rule {slug}: {type(exc).__name__}: {exc}"[:300],
        evidence=[f"raised at {where}", "the other rules still ran; please report this with the script"],
        fix="",
        source=source,
    )


T = TypeVar("T")


def guarded(slug: str, fn: Callable[[], Iterable[Finding]], *, source: str) -> list[Finding]:
    """Run ``fn`` (one rule's check); a crash becomes that rule's internal-error finding."""
    try:
        return list(fn())
    except Exception as exc:  # a broken rule must never cost the user the other findings
        return [internal_error(slug, exc, source=source)]


def rank_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Findings ordered most severe first, then by rule order in :data:`RULES`, then location."""
    order = {slug: i for i, slug in enumerate(RULES)}

    def key(f: Finding) -> tuple[int, int, str, int]:
        loc = f.location
        return (-int(f.severity), order.get(f.rule, len(order)), loc.file if loc else "", loc.line if loc else 0)

    return sorted(findings, key=key)

"""``scalpel fix --verify``: does the patched script train the same? Its first steps' losses against
the original's, through tune's own numerics gate.

Both copies run under plain python with the step timer (:mod:`torchscalpel.fix.steptimer`, which keeps
each of the first steps' losses as the runtime defines a step's loss), each from a fresh copy. The
comparison is :func:`torchscalpel.tune.verify.numerics_gate`, the gate tune's trials pass: the largest
relative loss deviation over the first :data:`~torchscalpel.tune.verify.GATE_STEPS` steps must stay
within the tolerance of the loosest numerics class among the patched changes (``exact``: 1e-4,
``close``: 2e-3, ``low precision``: 5e-2), or three times the script's own run-to-run deviation when
that is larger: tune's measured ``determinism`` for a tune run; otherwise, only when the first
comparison fails, the original run once more and its deviation from its first run (an unseeded
script is held to no tighter bound than it keeps).

Not every patched change is meant to leave the losses alone. Doctor fixes that change the training on
purpose (``grad-not-zeroed``, ``unseeded-run``, ...) are listed in :data:`CHANGES_TRAINING` with why;
when one is patched the losses are not compared, and the verdict says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchscalpel.sections import TuneSection
from torchscalpel.tune.knobs import CLOSE, EXACT, LOW_PRECISION, NUMERICS_ORDER
from torchscalpel.tune.verify import GATE_STEPS, loss_deviation, numerics_gate

if TYPE_CHECKING:
    from torchscalpel.fix.stage import FixResult

CHANGES_TRAINING: dict[str, str] = {
    "grad-not-zeroed": "zeroing the gradients changes every update after the first",
    "unseeded-run": "the seed changes the initial weights and the batches",
    "train-loader-not-shuffled": "shuffling changes the batches",
    "sampler-set-epoch-missing": "set_epoch changes the order of every epoch after the first",
    "module-in-plain-container": "the optimizer now trains the modules that were left out",
    "super-init-missing": "the original cannot build its model",
    "clip-before-unscale": "clipping now measures the unscaled gradients",
    "eval-in-train-mode": "the evaluation no longer draws dropout masks, so later training steps draw others",
    "eval-without-no-grad": "model.eval() around the evaluation may change the dropout masks later steps draw",
}
"""Doctor fixes whose purpose is to change what the script computes: their losses are not compared."""

DOCTOR_NUMERICS: dict[str, str] = {
    "unsafe-torch-load": EXACT,
    "whole-model-save": EXACT,
    "loss-graph-retained": EXACT,
    "tensor-attribute-not-registered": EXACT,
    "empty-cache-in-loop": EXACT,
    "cudnn-disabled": CLOSE,  # cuDNN's kernels sum in another order
}
"""The numerics class of each doctor fix that must leave the losses alone."""

MEMORY_NUMERICS: dict[str, str] = {
    "checkpoint-blocks": EXACT,  # the recomputed forward is the same arithmetic (RNG state restored)
    "set-to-none": EXACT,
    "micro-batches": CLOSE,  # the same batch summed in another order
    "bf16": LOW_PRECISION,
}
"""The numerics class of each memory rung fix patches."""


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the patched losses are held to: a numerics class and the script's known noise, or why they
    are not compared."""

    numerics: str | None
    noise: float = 0.0
    """The script's run-to-run relative loss deviation tune measured (0: not known)."""
    why_not: str = ""


def _loosest(classes: Sequence[str]) -> str:
    return max(classes, key=NUMERICS_ORDER.index) if classes else EXACT


def _tune_numerics(result: FixResult) -> tuple[str | None, float]:
    """The numerics class of tune's winning settings and tune's measured determinism."""
    from torchscalpel.tune.apply import numerics_class
    from torchscalpel.tune.settings import TuneSettings

    for _, record in result.records:
        tune = record.section(TuneSection)
        if tune is None or not tune.settings:
            continue
        try:
            numerics = numerics_class(TuneSettings.from_dict(tune.settings))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None, 0.0
        determinism = tune.determinism
        return numerics, float(determinism) if isinstance(determinism, int | float) else 0.0
    return None, 0.0


def expectation(result: FixResult) -> Expectation:
    """What the patched script's losses must match, from the patched items (see the module doc)."""
    patched = [i for i in result.items if i.status == "patched"]
    purposeful = sorted({i.rule for i in patched if i.source == "doctor" and i.rule in CHANGES_TRAINING})
    if purposeful:
        rule = purposeful[0]
        return Expectation(None, why_not=f"{rule} changes the training on purpose ({CHANGES_TRAINING[rule]})")
    classes: list[str] = []
    noise = 0.0
    for item in patched:
        if item.source == "doctor":
            classes.append(DOCTOR_NUMERICS.get(item.rule, EXACT))
        elif item.source == "memory":
            classes.append(MEMORY_NUMERICS.get(item.rule, CLOSE))
        elif item.source == "tune":
            numerics, noise = _tune_numerics(result)
            if numerics is None:
                return Expectation(None, why_not="the tune record's settings give no numerics class")
            classes.append(numerics)
    return Expectation(_loosest(classes), noise)


@dataclass(frozen=True, slots=True)
class LossVerdict:
    """The comparison's outcome: ``ok`` False only when the losses differ beyond the tolerance."""

    ok: bool
    line: str


def judge_losses(
    expect: Expectation,
    original: Sequence[float | None],
    patched: Sequence[float | None],
    rerun_original: Callable[[], Sequence[float | None] | None],
    second_original: Sequence[float | None] | None = None,
) -> LossVerdict:
    """Gate ``patched`` against ``original`` (see the module doc). ``second_original`` is another run of
    the original already made (tune's pairs); ``rerun_original`` makes one, called only when needed."""
    if expect.numerics is None:
        return LossVerdict(True, f"losses: not compared: {expect.why_not}")
    if not any(v is not None for v in original):
        return LossVerdict(True, "losses: not compared: the original run recorded no loss (no backward seen)")
    if not any(v is not None for v in patched):
        return LossVerdict(False, "losses: the patched run recorded no loss, where the original did")
    noise = expect.noise
    gate = numerics_gate(original, patched, expect.numerics, noise=noise)
    if not gate.passed:
        again = second_original if second_original is not None else rerun_original()
        own, _ = loss_deviation(original, again) if again else (None, 0)
        if own is not None:
            noise = max(noise, own)
            gate = numerics_gate(original, patched, expect.numerics, noise=noise)
    over = f"over the first {gate.steps} steps" if gate.steps else f"over the first {GATE_STEPS} steps"
    if gate.passed:
        dev = f"{gate.deviation:.1e}" if gate.deviation is not None else "-"
        return LossVerdict(
            True,
            f"losses: patched vs original {over}: largest relative deviation {dev}, within tune's "
            f"numerics tolerance {gate.tolerance:.1e} ({expect.numerics}{_noise_text(noise)})",
        )
    return LossVerdict(False, f"losses: patched vs original: {gate.reason}{_noise_text(noise)}")


def _noise_text(noise: float) -> str:
    return f"; the script's own run-to-run deviation {noise:.1e}" if noise else ""

"""Doctor rules on the validation curve: overfitting, an oscillating loss, a plateau.

The verdict is :func:`torchscalpel.doctor.eval_curve.judge` (torch-free, so that the report can print it
beside the curve) on the run's evaluation passes (``record.sections["eval"]``); a run with too few passes
gets no finding. The location is the user's line of the first evaluation loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torchscalpel.doctor import eval_curve
from torchscalpel.doctor.eval_curve import Verdict, judge, usable_passes
from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.runtime_rules import RuntimeRule
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.sections import EvalSection, SitesSection

OVERFITTING = RuleInfo(
    slug=eval_curve.OVERFITTING,
    severity=Severity.WARNING,
    category="numerics",
    summary="validation loss rising while the training loss falls (overfitting)",
    kinds=("runtime",),
)
OSCILLATING = RuleInfo(
    slug=eval_curve.OSCILLATING,
    severity=Severity.WARNING,
    category="numerics",
    summary="validation loss swinging up and down from one evaluation to the next",
    kinds=("runtime",),
)
PLATEAU = RuleInfo(
    slug=eval_curve.PLATEAU,
    severity=Severity.INFO,
    category="numerics",
    summary="validation loss no longer improving over the last evaluations",
    kinds=("runtime",),
)


class EvalCurve(RuntimeRule):
    """The verdict of :func:`judge` on the run's evaluation passes, as a finding."""

    infos = (OVERFITTING, OSCILLATING, PLATEAU)

    def findings(self, record: Any) -> Iterator[Finding]:
        section = record.section(EvalSection)
        if section is None:
            return
        passes = usable_passes(section.passes)
        train = [(s.index, float(s.loss)) for s in record.steps if isinstance(s.loss, int | float)]
        verdict = judge(passes, train)
        if verdict is None:
            return
        site = section.site or {}
        location = Location(file=site["file"], line=site["line"]) if site.get("file") else None
        yield _finding(verdict, location, _framework(record))


def _framework(record: Any) -> str | None:
    """``lightning`` or ``transformers`` when that library stepped the optimizer (its loop runs the training),
    else None: the fix is then written for a plain loop."""
    sites = record.section(SitesSection)
    if sites is None:
        return None
    for site in [sites.step, sites.backward, *sites.optimizers]:
        library = str((site or {}).get("library") or "")
        for name in ("lightning", "pytorch_lightning", "transformers"):
            if library == name or library.startswith(name + "."):
                return "transformers" if name == "transformers" else "lightning"
    return None


_EARLY_STOPPING = {
    "lightning": "from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint\n"
    'trainer = L.Trainer(..., callbacks=[EarlyStopping(monitor="val_loss", patience=3),\n'
    '                                    ModelCheckpoint(monitor="val_loss")])  # validation_step: self.log("val_loss", loss)\n'
    "# and regularise: weight_decay in configure_optimizers, dropout, more data",
    "transformers": "from transformers import EarlyStoppingCallback\n"
    'args = TrainingArguments(..., load_best_model_at_end=True, metric_for_best_model="eval_loss",\n'
    '                         eval_strategy="steps", save_strategy="steps", weight_decay=0.01)\n'
    "trainer = Trainer(..., args=args, callbacks=[EarlyStoppingCallback(early_stopping_patience=3)])",
}
_EARLY_STOPPING_PLAIN = (
    "# keep the weights of the best evaluation (early stopping) and regularise:\n"
    "if val_loss < best_val:\n"
    "    best_val = val_loss\n"
    '    torch.save(model.state_dict(), "best.pt")\n'
    "optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)  # + dropout, more data"
)


def _finding(verdict: Verdict, location: Location | None, framework: str | None) -> Finding:
    """The one place this module builds its findings."""
    f = verdict.figures
    where = f"evaluation loss computed at {fmt_loc(location)}"
    if verdict.slug == OVERFITTING.slug:
        return OVERFITTING.finding(
            f"The validation loss rose from its best {f['best']:.4g} (after step {f['best_step']:.0f}) to "
            f"{f['last']:.4g} while the training loss kept falling: the model is memorising its training data "
            "(overfitting); the weights of the best evaluation are better than the last ones.",
            evidence=[
                f"validation loss {f['best']:.4g} after step {f['best_step']:.0f}, {f['last']:.4g} after step "
                f"{f['last_step']:.0f} ({f['passes']:.0f} evaluation passes)",
                f"training loss over the same stretch: {f['train_best']:.4g} -> {f['train_last']:.4g}",
                where,
            ],
            fix=_EARLY_STOPPING.get(framework or "", _EARLY_STOPPING_PLAIN),
            location=location,
        )
    if verdict.slug == OSCILLATING.slug:
        return OSCILLATING.finding(
            f"The validation loss jumps up and down between evaluations (a median {f['swing']:.3g}, "
            f"{f['swing'] / f['median']:.0%} of its level, away from the midpoint of the passes either side): the learning rate is likely too high (the weights "
            "jump across the minimum), or the evaluation set is too small to measure it.",
            evidence=[
                f"{f['flips']:.0f} of {f['changes']:.0f} changes between consecutive passes reverse direction "
                f"({f['passes']:.0f} passes, median loss {f['median']:.4g})",
                where,
            ],
            fix="for group in optimizer.param_groups:  # a 3-10x lower learning rate, or decay it:\n"
            '    group["lr"] *= 0.3\n'
            "scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)",
            location=location,
        )
    return PLATEAU.finding(
        f"The validation loss has not improved over the last {f['tail']:.0f} evaluations (steps "
        f"{f['from_step']:.0f}-{f['last_step']:.0f}: {f['low']:.4g}-{f['high']:.4g}, best before "
        f"{f['earlier']:.4g}): more steps at this learning rate buy nothing.",
        evidence=[f"{f['passes']:.0f} evaluation passes; best {f['best']:.4g}", where],
        fix="scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=2)\n"
        "scheduler.step(val_loss)  # after each evaluation; or stop early and keep the best weights",
        location=location,
    )

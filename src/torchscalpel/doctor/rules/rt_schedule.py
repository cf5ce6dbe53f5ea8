"""Runtime learning-rate schedule rule: the lr Adam/AdamW actually used over the first steps of a transformer.

The static half (:mod:`~torchscalpel.doctor.rules.schedule_static`) reads the file; this half reads
``param_groups[0]["lr"]`` before each of the first optimizer steps, so a warm-up written any way (a
``LambdaLR``, a hand-written ``g["lr"] = ...``, a framework's scheduler) is seen as what it does: an lr that
rises. When the run watched enough steps its verdict replaces the static one.
"""

from __future__ import annotations

import ast
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.rules.schedule_static import NO_LR_WARMUP, WARMUP_MIN_LR, fix_for
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.patching import Undo, wrap_attr

LR_STEPS = 20
"""Optimizer steps whose lr is read (a warm-up rises within its first steps)."""
MIN_LR_STEPS = 3
"""Fewer steps than this: nothing is said (a warm-up cannot be told from a constant lr)."""
EARLY_RISE = 1.5
"""A loss this many times the first step's, within the steps read, is an early spike: the finding
becomes a warning."""
_FRAME_LIMIT = 60


def _style() -> str:
    """Who built the optimizer, from the stack: the Hugging Face Trainer, Lightning's
    ``configure_optimizers``, or the script itself (``plain``)."""
    frame: Any = sys._getframe(1)
    for _ in range(_FRAME_LIMIT):
        if frame is None:
            break
        code = frame.f_code
        if code.co_filename.replace("\\", "/").endswith("transformers/trainer.py"):
            return "hf"
        if code.co_name == "configure_optimizers":
            return "lightning"
        frame = frame.f_back
    return "plain"


def training_arguments_at(where: Location) -> Location | None:
    """The one ``TrainingArguments(...)`` call in the file of ``where`` (the user's line that ran the Trainer),
    where a Hugging Face script sets its schedule; None when the file has none, several, or cannot be read."""
    try:
        tree = ast.parse(Path(where.file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    lines = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "TrainingArguments"
    ]
    return Location(file=where.file, line=lines[0]) if len(lines) == 1 else None


def attention_modules(roots: list[torch.nn.Module]) -> list[str]:
    """Class names of the attention / transformer-layer modules under ``roots`` (what makes a model a
    transformer here), at most 200 modules read per root."""
    kinds = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer)
    found: list[str] = []
    for root in roots:
        for i, m in enumerate(root.modules()):
            if i >= 200:
                break
            if isinstance(m, kinds) or "Attention" in type(m).__name__:
                found.append(type(m).__name__)
    return found


class NoLrWarmup(RuntimeRule):
    """The first Adam/AdamW's lr over its first steps, on a model with attention modules."""

    info = NO_LR_WARMUP

    def __init__(self) -> None:
        super().__init__()
        self.lrs: list[float] = []
        self.attention: list[str] = []
        self._opt: weakref.ref[torch.optim.Optimizer] | None = None
        self._built: dict[int, tuple[Location | None, str]] = {}
        self.location: Location | None = None
        self.style = "plain"

    def setup(self) -> Undo:
        rule = self

        def built(opt: torch.optim.Optimizer) -> None:
            if id(opt) not in rule._built and isinstance(opt, torch.optim.Adam | torch.optim.AdamW):
                rule._built[id(opt)] = (user_location(), _style())

        safe = self.safe(built)

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def add_param_group(opt: torch.optim.Optimizer, param_group: Any) -> Any:
                safe(opt)  # called by the optimizer's __init__: the stack holds the line that built it
                return original(opt, param_group)

            return add_param_group

        return wrap_attr(torch.optim.Optimizer, "add_param_group", make)

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) or len(self.lrs) >= LR_STEPS:
            return
        if self._opt is None:
            self._opt = weakref.ref(optimizer)
            self.location, self.style = self._built.get(id(optimizer), (None, "plain"))
        elif self._opt() is not optimizer:
            return
        if not self.attention:
            # read again until a model was called: a closure (Lightning, LBFGS) runs the first forward inside
            # the first step
            self.attention = attention_modules(list(getattr(self.session, "root_modules", ()) or ()))
        lr: Any = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
        if lr is None:
            return
        try:
            self.lrs.append(float(lr))  # a tensor lr (capturable Adam) reads the same
        except (TypeError, ValueError):
            return
        if len(self.lrs) >= MIN_LR_STEPS:
            # the run saw what the lr does: the file's guess (static half) is no longer needed
            self.supersedes_static = True

    def on_optimizer_step_post(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.attention and self._opt is not None and self._opt() is optimizer:
            self.attention = attention_modules(list(getattr(self.session, "root_modules", ()) or ()))

    def findings(self, record: Any) -> Iterator[Finding]:
        lrs = self.lrs
        if len(lrs) < MIN_LR_STEPS or not self.attention:
            return
        peak = max(lrs)
        if lrs[0] < 0.999 * peak or lrs[0] < WARMUP_MIN_LR:
            return  # it rises (a warm-up), or starts at a fine-tuning rate
        evidence = [
            f"lr {lrs[0]:g} at the first optimizer step, never higher over the first {len(lrs)} steps "
            f"(last read {lrs[-1]:g})",
            f"{len(self.attention)} attention module(s) in the model ({self.attention[0]})",
        ]
        severity = None
        losses = [s.loss for s in (getattr(record, "steps", None) or [])[: len(lrs)] if s.loss is not None]
        if len(losses) >= MIN_LR_STEPS and losses[0] > 0 and max(losses) >= EARLY_RISE * losses[0]:
            top = max(losses)
            evidence.append(
                f"the loss rose to {top:.4g} ({top / losses[0]:.1f}x the first step's {losses[0]:.4g}) within "
                f"the first {len(losses)} steps: the early spike a warm-up prevents"
            )
            severity = Severity.WARNING
        location = self.location
        if location is not None:
            evidence.append(f"optimizer built at {fmt_loc(location)}")
            if self.style == "hf":
                # the Trainer builds the optimizer inside trainer.train(); the schedule is set where the
                # script builds its TrainingArguments, the line the fix edits
                location = training_arguments_at(location) or location
        yield NO_LR_WARMUP.finding(
            f"Adam(W) on a transformer starts at its peak learning rate {lrs[0]:g} with no warm-up: its "
            "second-moment estimate is noise for the first steps, so early updates are too large and the loss "
            "can spike or diverge; the baseline is a short linear warm-up, then cosine decay.",
            evidence=evidence,
            fix=fix_for(self.style),
            location=location,
            severity=severity,
        )

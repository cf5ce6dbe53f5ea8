"""Static learning-rate schedule rule: Adam/AdamW on a transformer at a pre-training lr with no warm-up.

Why it matters: Adam's second-moment estimate is noise for its first steps, so a transformer started at its
peak learning rate (1e-4 and up) often spikes or diverges early; the baseline every recipe uses is a short
linear warm-up then a cosine decay. The runtime half (:mod:`~torchscalpel.doctor.rules.rt_schedule`) reads the
optimizer's own lr over the first steps; this half reads the file (``scalpel doctor --static`` and the
scripts the run did not reach).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.static import StaticContext, StaticRule
from torchscalpel.findings import Finding, Severity

NO_LR_WARMUP = RuleInfo(
    slug="no-lr-warmup",
    severity=Severity.INFO,
    category="numerics",
    summary="Adam/AdamW on a transformer starts at its peak learning rate: no warm-up",
    kinds=("static", "runtime"),
)

WARMUP_MIN_LR = 1e-4
"""The smallest lr this rule speaks about: fine-tuning rates (2e-5, 5e-5) are usually stable without a
warm-up; pre-training and from-scratch rates (3e-4, 6e-4, 1e-3) are the ones that spike."""
ADAM_DEFAULT_LR = 1e-3
"""``torch.optim.Adam`` / ``AdamW``'s lr when the script gives none."""

_TRANSFORMER = re.compile(
    r"MultiheadAttention|nn\.Transformer|TransformerEncoder|TransformerDecoder|scaled_dot_product_attention"
    r"|ForCausalLM|ForMaskedLM|ForSequenceClassification|AutoModel|PreTrainedModel|class \w*(Attention|GPT)\w*"
)
# Schedulers that may hold a warm-up (or set it themselves): the runtime half decides from the lr it sees.
_MAY_WARM = ("LambdaLR", "LinearLR", "OneCycleLR", "SequentialLR", "ChainedScheduler", "get_scheduler")
_ADAM = ("Adam", "AdamW")


def is_transformer_source(source: str) -> bool:
    """The file builds or loads a transformer (attention layers, ``nn.Transformer*``, a transformers model)."""
    return _TRANSFORMER.search(source) is not None


def _number(node: ast.AST | None, consts: dict[str, float]) -> float | None:
    if node is None:
        return None
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _constants(tree: ast.Module) -> dict[str, float]:
    """Module-level ``LR = 3e-4`` style assignments (the lr a config block at the top sets)."""
    out: dict[str, float] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _number(node.value, {})
            if value is not None:
                out[node.targets[0].id] = value
    return out


def _has_warmup(ctx: StaticContext) -> bool:
    """The file warms up, or may: a scheduler that can hold a warm-up, a ``warmup`` name or keyword, or
    the lr written into the optimizer's param groups by hand (``g["lr"] = ...``)."""
    if "warmup" in ctx.source.lower() or "warm_up" in ctx.source.lower():
        return True
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Call):
            name = ctx.call_name(node) or ""
            if name.rsplit(".", 1)[-1] in _MAY_WARM:
                return True
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (
                    isinstance(t, ast.Subscript)
                    and isinstance(t.slice, ast.Constant)
                    and t.slice.value == "lr"
                ):
                    return True
    return False


def _style(ctx: StaticContext, call: ast.Call) -> str:
    """``lightning`` when the optimizer is built in ``configure_optimizers``, else ``plain``."""
    for fn in ast.walk(ctx.tree):
        if (
            isinstance(fn, ast.FunctionDef)
            and fn.name == "configure_optimizers"
            and any(c is call for c in ctx.calls(fn))
        ):
            return "lightning"
    return "plain"


PLAIN_FIX = """\
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

total_steps = EPOCHS * len(train_loader)  # the optimizer steps of the whole run
warmup_steps = max(1, total_steps // 20)  # ~5% linear warm-up, then cosine decay
scheduler = SequentialLR(
    optimizer,
    [LinearLR(optimizer, start_factor=0.01, total_iters=warmup_steps),
     CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup_steps))],
    milestones=[warmup_steps],
)
# in the loop, right after optimizer.step():
scheduler.step()"""

LIGHTNING_FIX = """\
def configure_optimizers(self):
    optimizer = torch.optim.AdamW(self.parameters(), lr=LR)
    total = self.trainer.estimated_stepping_batches
    warmup = max(1, total // 20)  # ~5% linear warm-up, then cosine decay
    scheduler = torch.optim.lr_scheduler.SequentialLR(
        optimizer,
        [torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01, total_iters=warmup),
         torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total - warmup))],
        milestones=[warmup],
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}"""

HF_FIX = """\
TrainingArguments(..., warmup_ratio=0.05, lr_scheduler_type="cosine")  # 5% linear warm-up, then cosine"""


def fix_for(style: str) -> str:
    """The baseline schedule (linear warm-up, then cosine) in the script's idiom: ``plain``, ``lightning``
    or ``hf`` (the Hugging Face Trainer)."""
    return {"lightning": LIGHTNING_FIX, "hf": HF_FIX}.get(style, PLAIN_FIX)


def no_lr_warmup(ctx: StaticContext) -> Iterator[Finding]:
    """``torch.optim.Adam(W)`` at lr >= 1e-4 (a literal or a module constant; the default 1e-3 when none is
    given), or ``TrainingArguments(learning_rate>=1e-4)`` without ``warmup_*``, in a file that builds a
    transformer and has no scheduler that could warm up."""
    if not is_transformer_source(ctx.source) or _has_warmup(ctx):
        return
    consts = _constants(ctx.tree)
    for call in ctx.calls():
        name = ctx.call_name(call) or ""
        last = name.rsplit(".", 1)[-1]
        if last == "TrainingArguments":
            lr_node = next((k.value for k in call.keywords if k.arg == "learning_rate"), None)
            lr = _number(lr_node, consts)
            if lr is None or lr < WARMUP_MIN_LR:
                continue
            style = "hf"
        elif last in _ADAM and (name.startswith("torch.optim") or name == last):
            lr_node = next((k.value for k in call.keywords if k.arg == "lr"), None)
            if lr_node is None and len(call.args) > 1:
                lr_node = call.args[1]
            lr = ADAM_DEFAULT_LR if lr_node is None else _number(lr_node, consts)
            if lr is None or lr < WARMUP_MIN_LR:
                continue
            style = _style(ctx, call)
        else:
            continue
        yield ctx.finding(
            NO_LR_WARMUP,
            call,
            f"{last} on a transformer starts at its peak learning rate {lr:g} with no warm-up: Adam's "
            "second-moment estimate is noise for its first steps, so early updates are too large and the loss "
            "can spike or diverge; the baseline is a short linear warm-up, then cosine decay.",
            fix=fix_for(style),
        )
        return


class NoLrWarmupStatic(StaticRule):
    info = NO_LR_WARMUP
    check = staticmethod(no_lr_warmup)

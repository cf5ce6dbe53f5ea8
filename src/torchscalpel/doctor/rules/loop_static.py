"""Static loop rules: ``empty_cache`` inside a loop, cuDNN switched off, scripts that train without setting a seed."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules import manual_update
from torchscalpel.doctor.rules.manual_update import manual_updates
from torchscalpel.doctor.static import StaticContext, StaticRule
from torchscalpel.findings import Finding, Severity


def empty_cache_in_loop(ctx: StaticContext) -> Iterator[Finding]:
    """``torch.cuda.empty_cache()`` inside a for/while loop body."""
    seen: set[int] = set()
    for loop in ast.walk(ctx.tree):
        if not isinstance(loop, ast.For | ast.While | ast.AsyncFor):
            continue
        for stmt in loop.body:
            for call in ctx.calls(stmt):
                if (
                    ctx.call_name(call) in {"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"}
                    and id(call) not in seen
                ):
                    seen.add(id(call))
                    yield ctx.finding(
                        EMPTY_CACHE_IN_LOOP,
                        call,
                        "torch.cuda.empty_cache() runs inside a loop: it synchronises the GPU and hands cached blocks "
                        "back to the driver, so the next step pays cudaMalloc again.",
                        fix="# remove it from the loop; if memory is fragmented, set\n"
                        "# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True instead",
                    )


_CUDNN_FLAG = {"torch.backends.cudnn.enabled"}


def cudnn_disabled(ctx: StaticContext) -> Iterator[Finding]:
    """``torch.backends.cudnn.enabled = False`` at any level (left on for the whole run) unless the file
    sets it back to True afterwards; ``with torch.backends.cudnn.flags(enabled=False):`` is scoped and fine."""
    offs: list[ast.Assign] = []
    ons: list[int] = []
    for node in ast.walk(ctx.tree):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if ctx.qualname(target) not in _CUDNN_FLAG or not isinstance(node.value, ast.Constant):
                continue
            if node.value.value is False or node.value.value == 0:
                offs.append(node)
            elif node.value.value is True:
                ons.append(node.lineno)
    for node in offs:
        if any(line > node.lineno for line in ons):
            continue  # switched off for one section and back on: a deliberate toggle
        yield ctx.finding(
            CUDNN_DISABLED,
            node,
            "cuDNN is switched off for the whole run: every convolution, RNN and batch norm on the GPU falls back "
            "to PyTorch's native kernels, several times slower (usually left over from debugging a cuDNN error "
            "or from chasing determinism).",
            fix="# delete the line; for reproducible results keep cuDNN on and ask for deterministic kernels:\n"
            "torch.backends.cudnn.benchmark = False\ntorch.use_deterministic_algorithms(True)\n"
            "# to avoid cuDNN in one place only:\nwith torch.backends.cudnn.flags(enabled=False):\n    out = rnn(x)",
        )


_SEED_SUFFIXES = ("manual_seed", "manual_seed_all", "seed_everything", "set_seed", "random.seed", "seed")
_LOOPS = (ast.For, ast.While, ast.AsyncFor, ast.With, ast.AsyncWith, ast.Try)


def is_entry_script(tree: ast.Module) -> bool:
    """True for a file meant to be run (an ``if __name__ == "__main__":`` block, or statements at module
    level that do work: loops, with-blocks, bare calls); False for a library module of functions and
    classes, whose caller decides about seeding."""
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return True
        if isinstance(node, _LOOPS):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return True
    return False


def manual_parameter_update(ctx: StaticContext) -> Iterator[Finding]:
    """Hand-written SGD updates: worth knowing that an optimizer does the same in two lines, plus more. What the
    message says of the script (its parameters, lr, clipping, lr changes) is read from the file
    (:mod:`~torchscalpel.doctor.rules.manual_update`)."""
    first = min(manual_updates(ctx), key=lambda n: getattr(n, "lineno", 0), default=None)
    if first is None:
        return
    update = manual_update.describe(ctx, first)  # one per file is enough: the first update, in line order
    yield ctx.finding(
        MANUAL_PARAMETER_UPDATE, first, manual_update.message(update), fix=manual_update.fix(update)
    )


def unseeded_run(ctx: StaticContext) -> Iterator[Finding]:
    """An entry script that calls ``.backward()`` and updates parameters (an optimizer ``step`` or a
    hand-written update) but never seeds any RNG. Library modules are left to their entry script."""
    backward = None
    for call in ctx.calls():
        if isinstance(call.func, ast.Attribute) and call.func.attr == "backward" and backward is None:
            backward = call
        name = ctx.call_name(call) or (call.func.attr if isinstance(call.func, ast.Attribute) else "")
        if name and name.endswith(_SEED_SUFFIXES):
            return
    if backward is None or not is_entry_script(ctx.tree):
        return
    if not ctx.mentions_attr("step") and next(manual_updates(ctx), None) is None:
        return
    yield ctx.finding(
        UNSEEDED_RUN,
        backward,
        "This script trains without setting a random seed: two runs differ, so a regression cannot be told "
        "from noise.",
        fix="import random, numpy as np, torch\nrandom.seed(0); np.random.seed(0); torch.manual_seed(0)",
    )


EMPTY_CACHE_IN_LOOP = RuleInfo(
    slug="empty-cache-in-loop",
    severity=Severity.WARNING,
    category="performance",
    summary="torch.cuda.empty_cache() called every step",
    kinds=("static", "runtime"),
)


class EmptyCacheInLoopStatic(StaticRule):
    info = EMPTY_CACHE_IN_LOOP
    check = staticmethod(empty_cache_in_loop)


CUDNN_DISABLED = RuleInfo(
    slug="cudnn-disabled",
    severity=Severity.WARNING,
    category="performance",
    summary="torch.backends.cudnn.enabled = False left on: native kernels instead of cuDNN",
    kinds=("static",),
)


class CudnnDisabledStatic(StaticRule):
    info = CUDNN_DISABLED
    check = staticmethod(cudnn_disabled)


UNSEEDED_RUN = RuleInfo(
    slug="unseeded-run",
    severity=Severity.INFO,
    category="reproducibility",
    summary="no random seed is set",
    kinds=("static", "runtime"),
)


class UnseededRunStatic(StaticRule):
    info = UNSEEDED_RUN
    check = staticmethod(unseeded_run)


MANUAL_PARAMETER_UPDATE = RuleInfo(
    slug="manual-parameter-update",
    severity=Severity.INFO,
    category="loop",
    summary="parameters updated by hand from .grad instead of by an optimizer",
    kinds=("static", "runtime"),
)


class ManualParameterUpdateStatic(StaticRule):
    info = MANUAL_PARAMETER_UPDATE
    check = staticmethod(manual_parameter_update)

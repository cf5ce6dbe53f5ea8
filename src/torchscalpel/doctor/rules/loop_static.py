"""Static loop rules: ``empty_cache`` inside a loop, scripts that train without setting a seed."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchscalpel.doctor.finding import Finding, Severity
from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.static import StaticContext, StaticRule


def empty_cache_in_loop(ctx: StaticContext) -> Iterator[Finding]:
    """``torch.cuda.empty_cache()`` inside a for/while loop body."""
    seen: set[int] = set()
    for loop in ast.walk(ctx.tree):
        if not isinstance(loop, ast.For | ast.While | ast.AsyncFor):
            continue
        for stmt in loop.body:
            for call in ctx.calls(stmt):
                if ctx.call_name(call) in {"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"} and id(call) not in seen:
                    seen.add(id(call))
                    yield ctx.finding(
                        "empty-cache-in-loop",
                        call,
                        "torch.cuda.empty_cache() runs inside a loop: it synchronises the GPU and hands cached blocks "
                        "back to the driver, so the next step pays cudaMalloc again.",
                        fix="# remove it from the loop; if memory is fragmented, set\n"
                        "# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True instead",
                    )


_SEED_SUFFIXES = ("manual_seed", "manual_seed_all", "seed_everything", "set_seed", "random.seed", "seed")


def unseeded_run(ctx: StaticContext) -> Iterator[Finding]:
    """A file that calls ``.backward()`` and an optimizer ``step`` but never seeds any RNG."""
    backward = None
    for call in ctx.calls():
        if isinstance(call.func, ast.Attribute) and call.func.attr == "backward" and backward is None:
            backward = call
        name = ctx.call_name(call) or (call.func.attr if isinstance(call.func, ast.Attribute) else "")
        if name and name.endswith(_SEED_SUFFIXES):
            return
    if backward is None or not ctx.mentions_attr("step"):
        return
    yield ctx.finding(
        "unseeded-run",
        backward,
        "This script trains without setting a random seed: two runs differ, so a regression cannot be told "
        "from noise.",
        fix="import random, numpy as np, torch\nrandom.seed(0); np.random.seed(0); torch.manual_seed(0)",
    )


class EmptyCacheInLoopStatic(StaticRule):
    info = RuleInfo(
        slug="empty-cache-in-loop",
        severity=Severity.WARNING,
        category="performance",
        summary="torch.cuda.empty_cache() called every step",
        kinds=("static", "runtime"),
    )
    check = staticmethod(empty_cache_in_loop)


class UnseededRunStatic(StaticRule):
    info = RuleInfo(
        slug="unseeded-run",
        severity=Severity.INFO,
        category="reproducibility",
        summary="no random seed is set",
        kinds=("static", "runtime"),
    )
    check = staticmethod(unseeded_run)

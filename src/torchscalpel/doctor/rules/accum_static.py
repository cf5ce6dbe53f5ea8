"""Static gradient-accumulation rules: the loss not divided by the number of micro-batches (or divided
twice), and DDP accumulating without ``no_sync()``.

Both read one pattern, found by :func:`accumulation_loops`: a loop whose optimizer steps all sit under
``if (i + 1) % k == 0:`` while ``.backward()`` runs on every iteration, or an inner ``for _ in range(k):``
holding the backward with the optimizer step after it (nanoGPT's micro-steps), or a counter
(``micro += 1`` ... ``if micro == k:``) in place of the modulo.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.static import StaticContext, StaticRule, local_nodes, own_nodes
from torchscalpel.findings import Finding, Severity

_LOOPS = (ast.For, ast.While, ast.AsyncFor)


@dataclass(slots=True)
class Accumulation:
    """One accumulation loop: the backward that accumulates, the step that applies, and ``k``."""

    loop: ast.AST
    backward: ast.Call
    step: ast.Call
    k: ast.AST
    """The expression of the number of micro-batches (the modulus, or ``range``'s argument)."""
    body: list[ast.stmt]
    """The statements the loss is computed in (where its divisions are looked for)."""


def _is_step(ctx: StaticContext, call: ast.Call) -> bool:
    """``optimizer.step()`` / ``opt.step()`` / ``scaler.step(optimizer)`` (never a scheduler's step)."""
    if not isinstance(call.func, ast.Attribute) or call.func.attr != "step":
        return False
    owner = (ctx.qualname(call.func.value) or ast.unparse(call.func.value)).lower()
    if "sched" in owner:
        return False
    return "opt" in owner or "scaler" in owner


def _is_backward(call: ast.Call) -> bool:
    """``x.backward()`` on a tensor expression (``accelerator.backward(loss)`` scales for itself)."""
    return isinstance(call.func, ast.Attribute) and call.func.attr == "backward" and not call.args


def _calls(node: ast.AST) -> Iterator[ast.Call]:
    for n in local_nodes(node):
        if isinstance(n, ast.Call):
            yield n


def _modulus(test: ast.AST) -> ast.AST | None:
    for n in ast.walk(test):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod):
            return n.right
    return None


def _counter_limit(test: ast.AST, body: ast.AST) -> ast.AST | None:
    """``k`` of ``if micro == k:`` / ``if micro >= k:`` where ``micro += 1`` runs in the loop body."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name)):
        return None
    if not isinstance(test.ops[0], ast.Eq | ast.GtE):
        return None
    name = test.left.id
    counted = any(
        isinstance(n, ast.AugAssign)
        and isinstance(n.op, ast.Add)
        and isinstance(n.target, ast.Name)
        and n.target.id == name
        for n in local_nodes(body)
    )
    return test.comparators[0] if counted else None


def _is_literal_one(ctx: StaticContext, k: ast.AST) -> bool:
    """``k`` is the literal 1, or a name assigned only the literal 1 in the file (no accumulation)."""
    if isinstance(k, ast.Constant):
        return k.value == 1
    if not isinstance(k, ast.Name):
        return False
    values = [
        n.value
        for n in ast.walk(ctx.tree)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == k.id for t in n.targets)
    ]
    return bool(values) and all(isinstance(v, ast.Constant) and v.value == 1 for v in values)


def accumulation_loops(ctx: StaticContext) -> Iterator[Accumulation]:
    """Every gradient-accumulation loop of the file (see the module docstring)."""
    for loop in ast.walk(ctx.tree):
        if not isinstance(loop, _LOOPS):
            continue
        body = ast.Module(body=list(loop.body), type_ignores=[])
        inner_loops = [n for n in local_nodes(body) if isinstance(n, _LOOPS)]
        in_inner = {id(c) for il in inner_loops for c in _calls(il)}
        guarded: dict[int, ast.AST] = {}  # id(step call) -> modulus
        for node in local_nodes(body):
            if (
                isinstance(node, ast.If)
                and (k := _modulus(node.test) or _counter_limit(node.test, body)) is not None
            ):
                for stmt in node.body:
                    for c in _calls(stmt):
                        if _is_step(ctx, c):
                            guarded[id(c)] = k
        steps = [c for c in _calls(body) if _is_step(ctx, c) and id(c) not in in_inner]
        backwards = [c for c in _calls(body) if _is_backward(c) and id(c) not in in_inner]
        if steps and guarded and all(id(s) in guarded for s in steps):
            ifs = [
                n
                for n in local_nodes(body)
                if isinstance(n, ast.If) and any(id(c) in guarded for c in _calls(n))
            ]
            unguarded = [b for b in backwards if not _under(body, b, ifs)]
            if unguarded and not _is_literal_one(ctx, guarded[id(steps[0])]):
                yield Accumulation(loop, unguarded[0], steps[0], guarded[id(steps[0])], list(loop.body))
            continue
        # nanoGPT: for micro_step in range(k): ... loss.backward()   then   optimizer.step()
        for il in inner_loops:
            if not (
                isinstance(il, ast.For)
                and isinstance(il.iter, ast.Call)
                and isinstance(il.iter.func, ast.Name)
                and il.iter.func.id == "range"
                and len(il.iter.args) == 1
            ):
                continue
            inner_back = [c for c in _calls(il) if _is_backward(c)]
            if inner_back and steps and not any(_is_step(ctx, c) for c in _calls(il)):
                k = il.iter.args[0]
                if not _is_literal_one(ctx, k):
                    yield Accumulation(loop, inner_back[0], steps[0], k, list(il.body))


def _under(body: ast.AST, call: ast.Call, ifs: list[ast.If]) -> bool:
    return any(call in [c for s in i.body for c in _calls(s)] for i in ifs)


def _divisions(
    ctx: StaticContext, expr: ast.AST, body: list[ast.stmt], before: int, depth: int = 0
) -> list[str]:
    """The divisors applied to the loss ``expr`` (as source text), following names assigned in ``body``
    before line ``before`` and the returns of functions of this file."""
    if depth > 8:
        return []
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.Div | ast.FloorDiv):
            return [ast.unparse(expr.right), *_divisions(ctx, expr.left, body, before, depth + 1)]
        if isinstance(expr.op, ast.Mult):
            for side, other in ((expr.left, expr.right), (expr.right, expr.left)):
                if (
                    isinstance(side, ast.BinOp)
                    and isinstance(side.op, ast.Div)
                    and isinstance(side.left, ast.Constant)
                    and side.left.value == 1
                ):
                    return [ast.unparse(side.right), *_divisions(ctx, other, body, before, depth + 1)]
        return [
            *_divisions(ctx, expr.left, body, before, depth + 1),
            *_divisions(ctx, expr.right, body, before, depth + 1),
        ]
    if isinstance(expr, ast.Call):
        if isinstance(expr.func, ast.Attribute) and expr.func.attr == "scale" and expr.args:
            return _divisions(ctx, expr.args[0], body, before, depth + 1)  # scaler.scale(loss)
        if isinstance(expr.func, ast.Attribute) and expr.func.attr in {"div", "div_"} and expr.args:
            return [ast.unparse(expr.args[0]), *_divisions(ctx, expr.func.value, body, before, depth + 1)]
        name = expr.func.id if isinstance(expr.func, ast.Name) else None
        fn = next((n for n in ast.walk(ctx.tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if fn is not None:
            out: list[str] = []
            for ret in (n for n in own_nodes(fn) if isinstance(n, ast.Return) and n.value is not None):
                out += _divisions(ctx, ret.value, fn.body, ret.lineno, depth + 1)  # type: ignore[arg-type]
            return out
        return []
    if isinstance(expr, ast.Name):
        latest: ast.AST | None = None
        for stmt in body:
            for n in ast.walk(stmt):
                if getattr(n, "lineno", before) >= before:
                    continue
                if isinstance(n, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == expr.id for t in n.targets
                ):
                    if latest is None or n.lineno > latest.lineno:  # type: ignore[attr-defined]
                        latest = n
                elif (
                    isinstance(n, ast.AugAssign)
                    and isinstance(n.target, ast.Name)
                    and n.target.id == expr.id
                    and (latest is None or n.lineno > latest.lineno)  # type: ignore[attr-defined]
                ):
                    latest = n
        if isinstance(latest, ast.AugAssign):
            own = [ast.unparse(latest.value)] if isinstance(latest.op, ast.Div) else []
            return own + _divisions(ctx, expr, body, latest.lineno, depth + 1)
        if isinstance(latest, ast.Assign):
            return _divisions(ctx, latest.value, body, latest.lineno, depth + 1)
    return []


def _grads_scaled(loop: ast.AST) -> bool:
    """The gradients are divided after backward instead (``p.grad /= k``, ``p.grad.div_(k)``)."""
    for n in local_nodes(loop):
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div) and "grad" in ast.unparse(n.target):
            return True
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in {"div_", "mul_"}
            and "grad" in ast.unparse(n.func.value)
        ):
            return True
    return False


def _loss_expr(call: ast.Call) -> ast.AST:
    return call.func.value  # type: ignore[attr-defined]


def grad_accum_loss_not_scaled(ctx: StaticContext) -> Iterator[Finding]:
    """An accumulation loop whose loss is not divided by ``k`` (the step applies ``k`` times the
    gradient), or is divided by ``k`` twice."""
    for acc in accumulation_loops(ctx):
        k = ast.unparse(acc.k)
        divisors = _divisions(ctx, _loss_expr(acc.backward), acc.body, acc.backward.lineno)
        step = f"step at {ctx.path}:{acc.step.lineno}: {ctx.line_text(acc.step)}"
        if not divisors and not _grads_scaled(acc.loop):
            yield ctx.finding(
                ACCUMULATED_LOSS_NOT_DIVIDED,
                acc.backward,
                f"Gradients are accumulated over `{k}` backward calls per optimizer step but the loss is not "
                f"divided by `{k}`: each update is `{k}` times the mean gradient (an effective learning rate "
                f"`{k}`x too high, and changing `{k}` changes the training).",
                evidence=[step],
                fix=f"loss = criterion(output, target) / {k}   # the mean over the {k} micro-batches\nloss.backward()",
            )
        elif divisors.count(k) >= 2:
            yield ctx.finding(
                ACCUMULATED_LOSS_NOT_DIVIDED,
                acc.backward,
                f"The loss is divided by {k} twice before backward: each update is the mean gradient divided by "
                f"{k} again (an effective learning rate {k}x too low).",
                evidence=[step, f"divided by: {', '.join(divisors)}"],
                fix=f"loss = criterion(output, target) / {k}   # once\nloss.backward()",
            )


_DDP = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.nn.DistributedDataParallel",
}


def ddp_accum_without_no_sync(ctx: StaticContext) -> Iterator[Finding]:
    """A DDP model in a file with an accumulation loop and no ``no_sync`` (nor
    ``require_backward_grad_sync``): every micro-batch's backward all-reduces the gradients."""
    if ctx.mentions_attr("no_sync") or ctx.mentions_attr("require_backward_grad_sync"):
        return
    ddp = next((c for c in ctx.calls() if ctx.call_name(c) in _DDP), None)
    if ddp is None:
        return
    for acc in accumulation_loops(ctx):
        k = ast.unparse(acc.k)
        yield ctx.finding(
            DDP_ACCUMULATION_WITHOUT_NO_SYNC,
            acc.backward,
            f"DDP all-reduces the gradients in every backward, and this loop runs {k} backward calls per "
            f"optimizer step without model.no_sync(): {k} all-reduces per step where one is needed.",
            evidence=[
                f"DDP built at {ctx.path}:{ddp.lineno}: {ctx.line_text(ddp)}",
                f"step at {ctx.path}:{acc.step.lineno}: {ctx.line_text(acc.step)}",
            ],
            fix=(
                "import contextlib\n"
                f"sync = (i + 1) % {k} == 0\n"
                "with contextlib.nullcontext() if sync else model.no_sync():  # all-reduce on the last micro-batch only\n"
                f"    (criterion(model(x), y) / {k}).backward()"
            ),
        )
        return


ACCUMULATED_LOSS_NOT_DIVIDED = RuleInfo(
    slug="accumulated-loss-not-divided",
    severity=Severity.WARNING,
    category="loop",
    summary="gradient accumulation with the loss not divided by the micro-batch count (or divided twice)",
    kinds=("static",),
)


class AccumulatedLossNotDividedStatic(StaticRule):
    info = ACCUMULATED_LOSS_NOT_DIVIDED
    check = staticmethod(grad_accum_loss_not_scaled)


DDP_ACCUMULATION_WITHOUT_NO_SYNC = RuleInfo(
    slug="ddp-accumulation-without-no-sync",
    severity=Severity.WARNING,
    category="distributed",
    summary="DDP gradient accumulation without no_sync(): an all-reduce on every micro-batch",
    kinds=("static", "runtime"),
)


class DdpAccumWithoutNoSyncStatic(StaticRule):
    info = DDP_ACCUMULATION_WITHOUT_NO_SYNC
    check = staticmethod(ddp_accum_without_no_sync)

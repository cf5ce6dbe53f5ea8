"""A hand-written parameter update (``manual-parameter-update``): where it is, and what the script around it
does, read from the code.

The finding tells the user what torch.optim would replace, so everything it says about the script comes from
the script: the parameters it updates (``fc.parameters()``, not a ``model`` it does not have), the factor of
``.grad`` (its lr), the gradient clipping it already does and the statements that change its lr (an annealing
``lr /= 4.0``, an ``lr = get_lr(it)`` schedule). A script that clips and anneals is never told it has "no
clipping or LR schedule"; the snippet carries both over. Both halves of the rule use this: the static rule on
the file it reads, the runtime rule on the file where it saw the parameters change.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from torchscalpel.doctor.static import MAX_SOURCE_BYTES, NotAnalysed, StaticContext, parse_source

CLIP_FUNCTIONS = (
    "clip_grad_norm_",
    "clip_grad_value_",
    "clip_grad_norm",
    "clip_grad_value",
    "clip_grads_with_norm_",
)
"""torch.nn.utils functions that clip gradients (matched on the last part of the called name)."""
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _mentions_grad(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(node))


def manual_updates(ctx: StaticContext) -> Iterator[ast.AST]:
    """Statements that update parameters in place from their ``.grad`` by hand (``p.data.add_(-lr * p.grad)``,
    ``p -= lr * p.grad``, ``w.data = w.data - lr * w.grad``), outside custom Optimizer classes."""
    skip: set[int] = set()
    for cls in ast.walk(ctx.tree):
        if isinstance(cls, ast.ClassDef) and any(
            (ctx.qualname(b) or "").rsplit(".", 1)[-1] == "Optimizer" for b in cls.bases
        ):
            skip.update(id(n) for n in ast.walk(cls))
    for node in ast.walk(ctx.tree):
        if id(node) in skip:
            continue
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"add_", "sub_", "copy_"}
        ):
            receiver = node.func.value
            if not _mentions_grad(receiver) and any(
                _mentions_grad(a) for a in [*node.args, *(k.value for k in node.keywords)]
            ):
                yield node
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Sub | ast.Add):
            if not _mentions_grad(node.target) and _mentions_grad(node.value):
                yield node
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Attribute)
            and node.targets[0].attr == "data"
            and _mentions_grad(node.value)
        ):
            yield node


@dataclass(kw_only=True, slots=True)
class ManualUpdate:
    """One hand-written update and what the script does around it, each part read from its AST."""

    node: ast.AST
    """The update statement (or call)."""
    line: int
    text: str
    """The update's source line, stripped."""
    params: ast.expr
    """What holds the updated parameters: the loop's iterable (``fc.parameters()``) or a list of their names."""
    lr: ast.expr | None
    """The factor of ``.grad`` in the update, sign dropped (``lr``, ``0.1``, ``args.lr``); None when not read."""
    through_data: bool
    """The update writes through ``.data`` (autograd's version checks bypassed)."""
    clips: list[tuple[int, str]] = field(default_factory=list)
    """``(line, function)`` of every gradient clipping call in the file."""
    lr_changes: list[tuple[int, str]] = field(default_factory=list)
    """``(line, statement)`` of every statement that changes the lr after it is first set (a schedule)."""


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _root_name(node: ast.AST) -> str | None:
    """``p`` for ``p``, ``p.data``, ``p.data.add_``: the name an attribute chain starts from."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _updated(node: ast.AST) -> ast.AST:
    """The expression the update writes: the receiver of ``add_``, the target of ``-=`` / ``.data =``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.value
    if isinstance(node, ast.AugAssign):
        return node.target
    if isinstance(node, ast.Assign):
        return node.targets[0]
    return node


def _unsigned(node: ast.expr) -> ast.expr:
    return node.operand if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) else node


def _lr_of(node: ast.AST) -> ast.expr | None:
    """The factor of ``.grad`` in the update: ``alpha=-lr``, or the other side of a product with the gradient."""
    if isinstance(node, ast.Call):
        for kw in node.keywords:
            if kw.arg == "alpha" and not _mentions_grad(kw.value):
                return _unsigned(kw.value)
    for sub in ast.walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mult):
            left, right = _mentions_grad(sub.left), _mentions_grad(sub.right)
            if left != right:
                return _unsigned(sub.right if left else sub.left)
    return None


def _params(ctx: StaticContext, node: ast.AST, parents: dict[int, ast.AST]) -> ast.expr:
    """What the update iterates: ``fc.parameters()`` of the enclosing ``for p in fc.parameters():``
    (``named_parameters()`` read as ``parameters()``), else a list of every name the file updates by hand."""
    name = _root_name(_updated(node))
    cur: ast.AST | None = parents.get(id(node))
    while cur is not None:
        if isinstance(cur, ast.For | ast.AsyncFor):
            target = cur.target
            names = [target] if isinstance(target, ast.Name) else list(getattr(target, "elts", []))
            if any(isinstance(t, ast.Name) and t.id == name for t in names):
                iterable = copy.deepcopy(cur.iter)
                if (
                    isinstance(iterable, ast.Call)
                    and isinstance(iterable.func, ast.Attribute)
                    and iterable.func.attr == "named_parameters"
                ):
                    iterable.func.attr = "parameters"
                return iterable
        cur = parents.get(id(cur))
    seen = list(dict.fromkeys(n for u in manual_updates(ctx) if (n := _root_name(_updated(u)))))
    return ast.List(elts=[ast.Name(id=n, ctx=ast.Load()) for n in seen], ctx=ast.Load())


def _inside_loop(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    cur = parents.get(id(node))
    while cur is not None:
        if isinstance(cur, _LOOPS):
            return True
        cur = parents.get(id(cur))
    return False


def _lr_changes(
    ctx: StaticContext, lr: ast.expr | None, parents: dict[int, ast.AST]
) -> list[tuple[int, str]]:
    """Statements that change ``lr`` once it is set: ``lr /= 4.0`` anywhere, ``lr = ...`` inside a loop or a
    second time; an lr computed by a call in the update itself (``alpha=-get_lr(it)``) is a schedule too."""
    if lr is None or isinstance(lr, ast.Constant):
        return []
    if not isinstance(lr, ast.Name | ast.Attribute):
        return [(getattr(lr, "lineno", 0), ast.unparse(lr))]
    key = ast.unparse(lr)
    changes: list[tuple[int, str]] = []
    assigns: list[ast.AST] = []
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.AugAssign) and ast.unparse(node.target) == key:
            changes.append((node.lineno, ctx.line_text(node)))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(ast.unparse(t) == key for t in targets):
                assigns.append(node)
    assigns.sort(key=lambda n: getattr(n, "lineno", 0))
    for pos, node in enumerate(assigns):
        if pos or _inside_loop(node, parents):
            changes.append((getattr(node, "lineno", 0), ctx.line_text(node)))
    return sorted(set(changes))


def describe(ctx: StaticContext, node: ast.AST) -> ManualUpdate:
    """What ``node`` (one of :func:`manual_updates`) updates, with which lr, and what the file does around it."""
    parents = _parents(ctx.tree)
    lr = _lr_of(node)
    clips = []
    for call in ctx.calls():
        name = ctx.call_name(call) or (call.func.attr if isinstance(call.func, ast.Attribute) else "")
        last = name.rsplit(".", 1)[-1]
        if last in CLIP_FUNCTIONS or (last in {"clamp_", "clip_"} and _mentions_grad(call.func)):
            clips.append((call.lineno, last))
    return ManualUpdate(
        node=node,
        line=getattr(node, "lineno", 1),
        text=ctx.line_text(node),
        params=_params(ctx, node, parents),
        lr=copy.deepcopy(lr),
        through_data=any(isinstance(n, ast.Attribute) and n.attr == "data" for n in ast.walk(_updated(node))),
        clips=sorted(set(clips)),
        lr_changes=_lr_changes(ctx, lr, parents),
    )


def message(update: ManualUpdate, *, seen_running: bool = False) -> str:
    """The finding's message: the update, then what the script already does that the optimizer must keep
    (``seen_running``: the runtime saw the parameters change with no optimizer, and says so)."""
    first = f"Parameters are updated by hand from their .grad at line {update.line} (`{update.text}`)"
    if seen_running:
        first += ": they changed between backward calls and no optimizer exists"
    if update.through_data:
        first += "; its writes through .data bypass autograd's checks"
    parts = [
        f"{first}. torch.optim does the same update in two lines, with momentum, weight decay and schedulers as options."
    ]
    if update.clips:
        line, name = update.clips[0]
        parts.append(
            f"The script clips its gradients ({name}, line {line}): keep that call between backward() and "
            "optimizer.step()."
        )
    if update.lr_changes:
        line, text = update.lr_changes[0]
        more = f" and {len(update.lr_changes) - 1} more" if len(update.lr_changes) > 1 else ""
        parts.append(
            f"The script changes its lr itself (line {line}: `{text}`{more}): hand the new value to the "
            "optimizer's param groups there, as below, or move it to a torch.optim.lr_scheduler."
        )
    return " ".join(parts)


def fix(update: ManualUpdate) -> str:
    """The replacement in the script's own names: the optimizer over the parameters it updates, with its lr;
    the step in place of the update; the lr handed over where the script changes it."""
    keywords = []
    simple_lr = update.lr is not None and isinstance(update.lr, ast.Name | ast.Attribute | ast.Constant)
    if simple_lr and update.lr is not None:
        keywords.append(ast.keyword(arg="lr", value=copy.deepcopy(update.lr)))
    make = ast.Assign(
        targets=[ast.Name(id="optimizer", ctx=ast.Store())],
        value=ast.Call(
            func=ast.Attribute(
                value=ast.Attribute(value=ast.Name(id="torch", ctx=ast.Load()), attr="optim", ctx=ast.Load()),
                attr="SGD",
                ctx=ast.Load(),
            ),
            args=[copy.deepcopy(update.params)],
            keywords=keywords,
        ),
    )
    lines = [
        f"{ast.unparse(ast.fix_missing_locations(ast.Module(body=[make], type_ignores=[])))}  # once, before the loop"
    ]
    if update.lr is not None and not simple_lr:
        lines.append(f"# the lr is {ast.unparse(update.lr)}: set before each step below")
    elif update.lr is None:
        lines.append("# lr: the factor of .grad in the hand-written update")
    if update.clips:
        clip_line, name = update.clips[0]
        lines.append(f"# {name} (line {clip_line}) stays where it is, before optimizer.step()")
    lines.append(f"# line {update.line}: the hand-written update becomes")
    if update.lr is not None and not simple_lr:
        lines += ["for group in optimizer.param_groups:", f'    group["lr"] = {ast.unparse(update.lr)}']
    lines += ["optimizer.step()", "optimizer.zero_grad()"]
    if update.lr_changes and simple_lr and update.lr is not None:
        line, _ = update.lr_changes[0]
        lines += [
            f"# line {line}: after the script changes {ast.unparse(update.lr)}, hand it to the optimizer",
            "for group in optimizer.param_groups:",
            f'    group["lr"] = {ast.unparse(update.lr)}',
        ]
    return "\n".join(lines)


def first_in_file(path: str) -> ManualUpdate | None:
    """The first hand-written update in the file at ``path``, described; None when the file cannot be read or
    parsed, or holds none (the runtime rule saw the parameters change and looks where the backward ran)."""
    import tokenize

    try:
        file = Path(path)
        if file.stat().st_size > MAX_SOURCE_BYTES:
            return None
        with tokenize.open(file) as fh:  # the file's own encoding (PEP 263)
            source = fh.read()
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    ctx = parse_source(source, path)
    if isinstance(ctx, NotAnalysed):
        return None
    first = next(iter(sorted(manual_updates(ctx), key=lambda n: getattr(n, "lineno", 0))), None)
    return None if first is None else describe(ctx, first)

"""The doctor-finding edits of evaluation code: ``no_grad`` (``eval-without-no-grad``) and ``eval_mode``
(``eval-in-train-mode``) (what each does: :mod:`torchscalpel.fix.editors.doctor`, which registers them).
"""

from __future__ import annotations

import builtins

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from torchscalpel.fix.cst import (
    Edit,
    EditError,
    Replace,
    ancestors,
    callee_name,
    calls_named,
    dotted,
    holds_name,
    indented_code,
    index_in,
    insert_at,
    is_docstring,
    method_call,
    node_code,
    owner_of,
    scope_of,
    statement_at,
    statements_of,
    walk_all,
    walk_nodes,
)

_NO_GRAD = frozenset({"no_grad", "inference_mode"})


_TRAINS = frozenset({"backward", "step", "zero_grad"})
"""Calls (``x.backward()``, ``opt.step()``, ``opt.zero_grad()``) that make a block a training block."""


def _trains(root: cst.CSTNode) -> bool:
    return any(isinstance(c.func, cst.Attribute) for c in calls_named(root, _TRAINS))


def _has_torch(module: cst.Module) -> None:
    for s in module.body:
        if (
            isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], cst.Import)
            and any(dotted(n.name) == "torch" and n.asname is None for n in s.body[0].names)
        ):
            return
    raise EditError("the file has no top-level 'import torch' to call torch.no_grad through")


def _local_names(module: cst.Module) -> set[str]:
    """Names bound by imports, ``def`` and ``class`` anywhere in the file: callables, not models."""
    names: set[str] = set()
    for node in walk_all(module):
        if isinstance(node, cst.FunctionDef | cst.ClassDef):
            names.add(node.name.value)
        elif isinstance(node, cst.Import | cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                bound = alias.asname.name if alias.asname else alias.name
                names.add(dotted(bound).split(".")[0] if isinstance(bound, cst.BaseExpression) else "")
    return names


def _model_called(module: cst.Module, stmt: cst.CSTNode, line: int) -> str:
    """The model the statement calls: the one call of a plain name (or ``self.NAME``) that is no
    builtin, import, function or class of the file (``model`` in ``loss = F.cross_entropy(model(x), y)``)."""
    skip = _local_names(module) | set(dir(builtins))
    models = {
        node_code(c.func)
        for c in walk_nodes(stmt)
        if isinstance(c, cst.Call)
        and (
            (isinstance(c.func, cst.Name) and c.func.value not in skip)
            or (
                isinstance(c.func, cst.Attribute)
                and isinstance(c.func.value, cst.Name)
                and c.func.value.value == "self"
            )
        )
    }
    if len(models) != 1:
        raise EditError(f"line {line} does not call one model by name ({len(models)} candidates)")
    return models.pop()


def _no_grad_decorated(func: cst.FunctionDef) -> bool:
    return any(
        callee_name(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) in _NO_GRAD
        for d in func.decorators
    )


def _is_no_grad_with(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.With) and any(
        isinstance(i.item, cst.Call) and callee_name(i.item.func) in _NO_GRAD for i in node.items
    )


def _calls_method_on(root: cst.CSTNode, model: str, method: str) -> bool:
    return any(
        isinstance(c.func, cst.Attribute) and c.func.attr.value == method and node_code(c.func.value) == model
        for c in calls_named(root, {method})
    )


def _in_function(func: cst.FunctionDef, start: str, end: str) -> cst.FunctionDef:
    """``func`` with ``start`` after its docstring and ``end`` as its last statement, before a final
    ``return`` (a function with another ``return`` is refused: the end would be skipped)."""
    body = indented_code(func)
    returns = [n for n in walk_nodes(func) if isinstance(n, cst.Return)]
    last_is_return = isinstance(body[-1], cst.SimpleStatementLine) and isinstance(
        body[-1].body[0], cst.Return
    )
    if len(returns) > 1 or (returns and not last_is_return):
        raise EditError(
            f"{func.name.value}() returns from more than one place, so the model's mode cannot be restored"
        )
    first = 1 if is_docstring(body[0]) else 0
    new = [*body[:first], *statements_of(start), *body[first:]]
    at = len(new) - 1 if last_is_return else len(new)
    new[at:at] = statements_of(end)
    return func.with_changes(body=func.body.with_changes(body=new))


def no_grad_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``no_grad``: the evaluation forward under ``torch.no_grad()`` (see
    :mod:`torchscalpel.fix.editors.doctor`)."""
    options = dict(edit.kwargs)
    train_line, eval_mode = int(options.get("train_line") or 0), bool(options.get("eval_mode"))
    stmt, _ = statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    # The line itself may be the block: what this fix inserted above it moved it down.
    for a in [stmt, *ancestors(stmt, parents)]:
        if _is_no_grad_with(a) or (isinstance(a, cst.FunctionDef) and _no_grad_decorated(a)):
            return None
    _has_torch(module)
    if train_line == edit.line:
        raise EditError(f"line {edit.line} also runs the training forward, so it cannot go under no_grad")
    model = _model_called(module, stmt, edit.line) if eval_mode else ""
    func = scope_of(stmt, parents)
    if isinstance(func, cst.FunctionDef) and not _trains(func) and not holds_name(wrapper, func, train_line):
        # The evaluation function (nanoGPT's estimate_loss): decorated, as torch's own idiom.
        new = func.with_changes(
            decorators=[cst.Decorator(decorator=cst.parse_expression("torch.no_grad()")), *func.decorators]
        )
        if func.decorators:  # the comments above the first decorator stay above the new one
            new = new.with_changes(
                decorators=[
                    new.decorators[0].with_changes(leading_lines=func.decorators[0].leading_lines),
                    func.decorators[0].with_changes(leading_lines=()),
                    *func.decorators[1:],
                ]
            )
        else:
            new = new.with_changes(leading_lines=func.leading_lines)
        if eval_mode and not _calls_method_on(func, model, "eval"):
            new = _in_function(new, f"{model}.eval()\n", f"{model}.train()\n")
        return module.visit(Replace(func, new))
    # Inside the training function (or at module level): the innermost loop holding the forward that
    # does not train, else the statement alone.
    block: cst.CSTNode = stmt
    for a in ancestors(stmt, parents):
        if isinstance(a, cst.FunctionDef | cst.ClassDef):
            break
        if isinstance(a, cst.For | cst.While):
            if not _trains(a) and not holds_name(wrapper, a, train_line):
                block = a
            break
    if block is stmt and not isinstance(stmt, cst.SimpleStatementLine):
        raise EditError(
            f"line {edit.line} opens a block that also does other things; no_grad cannot wrap it alone"
        )
    owner = owner_of(block, parents)
    before = after = ""
    if eval_mode and not _calls_method_on_before(owner, block, model):
        before, after = f"{model}.eval()\n", f"{model}.train()\n"
    new_owner = insert_at(owner, block, before=before, after=after, wrap="torch.no_grad()")  # type: ignore[arg-type]
    return module.visit(Replace(owner, new_owner))


def _calls_method_on_before(owner: cst.CSTNode, block: cst.CSTNode, model: str) -> bool:
    """True when a statement before ``block`` in its block is ``MODEL.eval()``."""
    body = indented_code(owner)
    return any(
        (m := method_call(s, "eval")) is not None and m[0] == model for s in body[: index_in(body, block)]
    )


def eval_mode_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``eval_mode``: ``MODEL.eval()`` before the no-grad block holding the forward, ``MODEL.train()`` after
    it."""
    stmt, _ = statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    if method_call(stmt, "eval") is not None:  # the line this fix inserted (it moved the forward down)
        return None
    model = _model_called(module, stmt, edit.line)
    # The line itself may be the block: this fix's model.eval() above it moved it down a line.
    for a in [stmt, *ancestors(stmt, parents)]:
        if _is_no_grad_with(a):
            owner = owner_of(a, parents)
            body = indented_code(owner)
            i = index_in(body, a)
            if i and (m := method_call(body[i - 1], "eval")) is not None and m[0] == model:
                return None
            new = insert_at(owner, a, before=f"{model}.eval()\n", after=f"{model}.train()\n")  # type: ignore[arg-type]
            return module.visit(Replace(owner, new))
        if isinstance(a, cst.FunctionDef):
            if not _no_grad_decorated(a):
                break
            if _calls_method_on(a, model, "eval"):
                return None
            return module.visit(Replace(a, _in_function(a, f"{model}.eval()\n", f"{model}.train()\n")))
    raise EditError(f"no torch.no_grad() block or decorator around line {edit.line} in this file")

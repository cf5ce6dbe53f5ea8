"""The doctor-finding edits of the training loop: ``set_epoch``, ``shuffle``, ``unscale_before_clip`` and
``detach_kept`` (what each does: :mod:`torchscalpel.fix.editors.doctor`, which registers them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from torchscalpel.fix.cst import (
    Edit,
    EditError,
    Replace,
    ReplaceAll,
    ancestors,
    callee_name,
    calls_named,
    dotted,
    indented_code,
    index_in,
    insert_at,
    is_name,
    method_call,
    node_code,
    owner_of,
    scope_of,
    set_kwargs,
    statement_at,
    walk_all,
    walk_nodes,
)


def _iterated(node: cst.BaseExpression) -> str:
    """The loader a ``for`` iterates: ``loader`` in ``loader``, ``enumerate(loader)``, ``tqdm(loader)``."""
    if isinstance(node, cst.Call) and node.args and node.args[0].keyword is None and not node.args[0].star:
        node = node.args[0].value
    if isinstance(node, cst.Name | cst.Attribute) and dotted(node):
        return node_code(node)
    raise EditError("the loop does not iterate a named DataLoader")


def _assignments(
    module: cst.Module, parents: Any, scope: cst.CSTNode | None
) -> Iterator[tuple[str, cst.Call]]:
    """``(target, call)`` for each ``TARGET = CALL(...)`` in ``scope`` (its own body, not nested scopes)."""
    for node in walk_nodes(scope if scope is not None else module):
        if (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and isinstance(node.value, cst.Call)
            and scope_of(node, parents) is scope
        ):
            yield node_code(node.targets[0].target), node.value


def _kwarg(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def _built_loader(loader: str, module: cst.Module, parents: Any, scope: cst.CSTNode | None) -> cst.Call:
    """The one ``DataLoader(...)`` call ``loader`` is assigned from in ``scope``."""
    built = [
        c
        for t, c in _assignments(module, parents, scope)
        if t == loader and callee_name(c.func) == "DataLoader"
    ]
    if len(built) != 1:
        raise EditError(
            f"{loader} is not built once by a DataLoader(...) call in the same function as its loop"
        )
    return built[0]


def _sampler_of(loader: str, module: cst.Module, parents: Any, scope: cst.CSTNode | None) -> str:
    """What to call ``set_epoch`` on for ``loader``: the name passed as its ``sampler=``, or
    ``loader.sampler`` when the DistributedSampler is built inside the DataLoader call."""
    sampler = _kwarg(_built_loader(loader, module, parents, scope), "sampler")
    if isinstance(sampler, cst.Call) and callee_name(sampler.func) == "DistributedSampler":
        return f"{loader}.sampler"
    if isinstance(sampler, cst.Name | cst.Attribute) and dotted(sampler):
        return node_code(sampler)
    raise EditError(f"the DataLoader {loader} is given no sampler= argument to name")


def _loader_of(sampler: str, module: cst.Module, parents: Any, scope: cst.CSTNode | None) -> str:
    """The one DataLoader built with ``sampler=SAMPLER`` in ``scope``."""
    loaders = [
        t
        for t, c in _assignments(module, parents, scope)
        if callee_name(c.func) == "DataLoader"
        and (s := _kwarg(c, "sampler")) is not None
        and node_code(s) == sampler
    ]
    if len(loaders) != 1:
        raise EditError(f"{_count(len(loaders), 'DataLoader')} built with sampler={sampler} in that function")
    return loaders[0]


def _count(n: int, what: str) -> str:
    return f"no {what} is" if n == 0 else f"{n} {what}s are"


def set_epoch_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``set_epoch``: ``SAMPLER.set_epoch(EPOCH)`` first in the epoch loop."""
    stmt, _ = statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    if method_call(stmt, "set_epoch") is not None:  # the line this fix inserted (it moved the loop down)
        return None
    scope = scope_of(stmt, parents)
    if isinstance(stmt, cst.For):  # runtime: the loop that iterated the sampler
        inner: cst.For = stmt
        sampler = _sampler_of(_iterated(stmt.iter), module, parents, scope)
    else:  # static: the statement building the DistributedSampler
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if not (
            isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Call)
        ):
            raise EditError(
                f"line {edit.line} neither loops over a DataLoader nor assigns a DistributedSampler"
            )
        target, call = node_code(small.targets[0].target), small.value
        if callee_name(call.func) == "DistributedSampler":
            sampler, loader = target, _loader_of(target, module, parents, scope)
        elif callee_name(call.func) == "DataLoader":
            sampler, loader = _sampler_of(target, module, parents, scope), target
        else:
            raise EditError(f"line {edit.line} does not build the DistributedSampler")
        loops = [
            n
            for n in walk_nodes(scope if scope is not None else module)
            if isinstance(n, cst.For) and _loops_over(n, loader)
        ]
        if len(loops) != 1:
            raise EditError(f"{_count(len(loops), 'loop')} over {loader} in that function")
        inner = loops[0]
    outer = next(
        (a for a in ancestors(inner, parents) if isinstance(a, cst.For | cst.While | cst.FunctionDef)), None
    )
    if not isinstance(outer, cst.For) or scope_of(outer, parents) is not scope:
        raise EditError("the loop over the DataLoader is not inside a for loop over the epochs")
    if not isinstance(outer.target, cst.Name):
        raise EditError("the epoch loop's target is not one plain name to pass to set_epoch")
    body = indented_code(outer)
    if any(".set_epoch(" in node_code(s) for s in body):
        return None
    new = insert_at(outer, body[0], before=f"{sampler}.set_epoch({outer.target.value})\n")
    return module.visit(Replace(outer, new))


def _loops_over(loop: cst.For, loader: str) -> bool:
    try:
        return _iterated(loop.iter) == loader
    except EditError:
        return False


def _backward_loss(stmt: cst.CSTNode, line: int) -> str:
    """``loss`` for ``loss.backward()``, ``(loss / k).backward()``, ``scaler.scale(loss).backward()``."""
    calls = [
        c
        for c in walk_nodes(stmt)
        if isinstance(c, cst.Call) and isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward"
    ]
    if len(calls) != 1:
        raise EditError(f"line {line} does not call backward() once")
    root: cst.BaseExpression = calls[0].func.value  # type: ignore[attr-defined]
    if isinstance(root, cst.BinaryOperation):
        root = root.left
    elif isinstance(root, cst.Call) and callee_name(root.func) == "scale" and len(root.args) == 1:
        root = root.args[0].value
    if not isinstance(root, cst.Name):
        raise EditError(f"the loss backward() is called on at line {line} is not one plain name")
    return root.value


def _kept(small: cst.BaseSmallStatement, loss: str) -> tuple[str, cst.BaseExpression] | None:
    """``("add", value)`` for ``X += LOSS``, ``("append", value)`` for ``X.append(LOSS)``: the value
    is the loss (not yet fixed) or ``LOSS.item()`` / ``LOSS.detach()`` (fixed)."""
    if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign):
        return "add", small.value
    if (
        isinstance(small, cst.Expr)
        and isinstance(small.value, cst.Call)
        and isinstance(small.value.func, cst.Attribute)
        and small.value.func.attr.value == "append"
        and len(small.value.args) == 1
    ):
        return "append", small.value.args[0].value
    return None


def _is_fixed(node: cst.BaseExpression, loss: str) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in ("item", "detach")
        and is_name(node.func.value, loss)
    )


def _used_as_tensor(module: cst.Module, target: cst.BaseExpression) -> bool:
    """True unless ``target`` is a plain name the file never reads an attribute of or indexes
    (``total.item()``): only then may it become a Python float."""
    if not isinstance(target, cst.Name):
        return True
    return any(
        isinstance(n, cst.Attribute | cst.Subscript) and is_name(n.value, target.value)
        for n in walk_all(module)
    )


def detach_kept_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``detach_kept``: a loss kept across steps as a number (``.item()``) or detached."""
    stmt, _ = statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    loss = _backward_loss(stmt, edit.line)
    scope = next(
        (a for a in ancestors(stmt, parents) if isinstance(a, cst.For | cst.While | cst.FunctionDef)), module
    )
    found, fixed = [], 0
    for node in walk_nodes(scope):
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                kept = _kept(small, loss)
                if kept is None:
                    continue
                if is_name(kept[1], loss):
                    found.append((small, kept[0]))
                elif _is_fixed(kept[1], loss):
                    fixed += 1
    if not found:
        if fixed:
            return None
        raise EditError(
            f"no 'X += {loss}' or 'X.append({loss})' keeps the loss in the code around line {edit.line}"
        )
    replace: dict[cst.CSTNode, cst.CSTNode] = {}
    for small, how in found:
        if how == "add":
            assert isinstance(small, cst.AugAssign)
            method = "detach" if _used_as_tensor(module, small.target) else "item"
            repl: cst.CSTNode = small.with_changes(value=cst.parse_expression(f"{loss}.{method}()"))
        else:
            assert isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
            arg = small.value.args[0].with_changes(value=cst.parse_expression(f"{loss}.detach()"))
            repl = small.with_changes(value=small.value.with_changes(args=[arg]))
        replace[small] = repl
    return module.visit(ReplaceAll(replace))


def unscale_before_clip_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``unscale_before_clip``: ``SCALER.unscale_(OPT)`` before the clipping call."""
    stmt, _ = statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    if method_call(stmt, "unscale_") is not None:  # the line this fix inserted (it moved the clip down)
        return None
    if not isinstance(stmt, cst.SimpleStatementLine) or not calls_named(
        stmt, {"clip_grad_norm_", "clip_grad_value_"}
    ):
        raise EditError(f"line {edit.line} does not clip gradients")
    scalers = {
        node_code(c.func.value) for c in calls_named(module, {"scale"}) if isinstance(c.func, cst.Attribute)
    }
    owner = owner_of(stmt, parents)
    body = indented_code(owner)
    i = index_in(body, stmt)
    if i and method_call(body[i - 1], "unscale_") is not None:
        return None
    # The scaler.step(opt) after the clip: in the same block, or after the block the clip sits in
    # (``if clip: ...``), up to the loop or function around it.
    steps: list[tuple[str, str]] = []
    node: cst.CSTNode = stmt
    while not steps:
        holder = owner_of(node, parents)
        siblings = indented_code(holder)
        for s in siblings[index_in(siblings, node) + 1 :]:
            m = method_call(s, "step")
            if m is not None and m[0] in scalers and len(m[1].args) == 1 and m[1].args[0].keyword is None:
                steps.append((m[0], node_code(m[1].args[0].value)))
        if isinstance(holder, cst.For | cst.While | cst.FunctionDef | cst.Module) or steps:
            break
        node = holder
    if len(steps) != 1:
        raise EditError(
            f"no one SCALER.step(OPTIMIZER) follows the clipping at line {edit.line} to name them"
        )
    scaler, opt = steps[0]
    new = insert_at(owner, stmt, before=f"{scaler}.unscale_({opt})\n")
    return module.visit(Replace(owner, new))


def shuffle_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``shuffle``: ``shuffle=True`` on the loader the loop iterates (or its sampler)."""
    stmt, _ = statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    if not isinstance(stmt, cst.For):
        raise EditError(f"line {edit.line} does not loop over a DataLoader")
    loader, scope = _iterated(stmt.iter), scope_of(stmt, parents)
    target = _built_loader(loader, module, parents, scope)
    if _kwarg(target, "batch_sampler") is not None:
        raise EditError(f"{loader} takes a batch_sampler, which decides the order itself")
    sampler = _kwarg(target, "sampler")
    if sampler is not None:  # only a DistributedSampler(shuffle=False) is turned to shuffle
        if isinstance(sampler, cst.Name):
            named = [c for t, c in _assignments(module, parents, scope) if t == sampler.value]
            sampler = named[0] if len(named) == 1 else None
        if not (isinstance(sampler, cst.Call) and callee_name(sampler.func) == "DistributedSampler"):
            raise EditError(
                f"{loader} takes a sampler that is not a DistributedSampler built in that function"
            )
        target = sampler
    shuffle = _kwarg(target, "shuffle")
    if isinstance(shuffle, cst.Name) and shuffle.value == "True":
        return None
    new = set_kwargs(
        target, Edit(kind="call_kwargs", callee=callee_name(target.func), kwargs=(("shuffle", True),))
    )
    return module.visit(Replace(target, new))

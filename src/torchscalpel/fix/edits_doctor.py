"""The libcst edits for doctor findings whose fix is one mechanical change at the finding's line.

Like :mod:`torchscalpel.fix.edits` (whose helpers these use, and whose ``apply_edit`` dispatches
here), every editor starts from the statement at the recorded line, reads from the code there the
names it needs (the sampler, the epoch variable, the model, the scaler and optimizer, the kept loss),
and raises :class:`~torchscalpel.fix.edits.EditError` (``not patched``) when the code is not what the
rule saw, instead of looking elsewhere. Each returns None when the fix is already there, so a second
``scalpel fix`` gives no diff.

The kinds:

- ``set_epoch`` (``sampler-set-epoch-missing``): ``SAMPLER.set_epoch(EPOCH)`` as the first statement
  of the epoch loop, the ``for`` loop around the loop over the DataLoader whose sampler it is. The
  line is that inner loop (runtime) or the statement building the sampler (static).
- ``no_grad`` (``eval-without-no-grad``): the evaluation forward at the line under ``torch.no_grad()``:
  as a decorator of the function that holds it when that function never trains (nanoGPT's
  ``estimate_loss``), else around the innermost loop holding it that never trains, else around the
  statement alone; ``MODEL.eval()`` before and ``MODEL.train()`` after when the run saw those forwards
  in training mode. Never around the training forward's line.
- ``eval_mode`` (``eval-in-train-mode``): ``MODEL.eval()`` before the ``with torch.no_grad():`` block
  (or at the top of the ``@torch.no_grad()`` function) holding the forward, ``MODEL.train()`` after it.
- ``detach_kept`` (``loss-graph-retained``): in the loop (or function) of the backward at the line,
  ``X += loss`` becomes ``X += loss.item()`` (``.detach()`` when the file uses ``X`` as a tensor) and
  ``X.append(loss)`` becomes ``X.append(loss.detach())``.
- ``unscale_before_clip`` (``clip-before-unscale``): ``SCALER.unscale_(OPT)`` before the clipping call,
  with the names read from the ``SCALER.step(OPT)`` that follows it.
- ``shuffle`` (``train-loader-not-shuffled``): ``shuffle=True`` on the ``DataLoader(...)`` the loop at
  the line iterates, or on its ``DistributedSampler(..., shuffle=False)``.
- ``module_container`` (``module-in-plain-container``): ``self.x = [...]`` / ``{...}`` at the line
  becomes ``nn.ModuleList([...])`` / ``nn.ModuleDict({...})``.
- ``register_buffer`` (``tensor-attribute-not-registered``): ``self.x = <tensor>`` in ``__init__``
  becomes ``self.register_buffer("x", <tensor>)``.
- ``super_init_first`` (``super-init-missing``): ``super().__init__()`` as the first statement of the
  ``__init__`` at the line (moved there when it comes later and takes only the parameters).
- ``delete_statement`` (``empty-cache-in-loop``, ``cudnn-disabled``): the statement at the line, when it
  is exactly ``torch.cuda.empty_cache()`` / ``torch.backends.cudnn.enabled = False`` (``callee`` says
  which); a block left empty gets ``pass``. Already done: no such statement is left in the file.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from torchscalpel.fix.edits import (
    Edit,
    EditError,
    _Replace,
    _set_kwargs,
    _statement_at,
    _statements,
    callee_name,
    dotted,
)

KINDS = (
    "set_epoch",
    "no_grad",
    "eval_mode",
    "detach_kept",
    "unscale_before_clip",
    "shuffle",
    "module_container",
    "register_buffer",
    "super_init_first",
    "delete_statement",
)
"""The kinds this module edits (registered in :data:`torchscalpel.fix.edits._EDITORS`)."""

_NO_GRAD = frozenset({"no_grad", "inference_mode"})
_TRAINS = frozenset({"backward", "step", "zero_grad"})
"""Calls (``x.backward()``, ``opt.step()``, ``opt.zero_grad()``) that make a block a training block."""
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _ancestors(node: cst.CSTNode, parents: Any) -> Iterator[cst.CSTNode]:
    node = parents.get(node)
    while node is not None:
        yield node
        node = parents.get(node)


def _scope_of(node: cst.CSTNode, parents: Any) -> cst.CSTNode | None:
    """The innermost function or class holding ``node`` (None: module level)."""
    return next((a for a in _ancestors(node, parents) if isinstance(a, cst.FunctionDef | cst.ClassDef)), None)


class _Walk(cst.CSTVisitor):
    """Every node under a root, without entering nested functions, classes or lambdas."""

    def __init__(self, root: cst.CSTNode) -> None:
        self.root, self.nodes = root, []  # type: ignore[var-annotated]

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return node is self.root or not isinstance(node, _SCOPES)


def _walk(root: cst.CSTNode) -> list[cst.CSTNode]:
    walker = _Walk(root)
    root.visit(walker)
    return list(walker.nodes)


def _calls_named(root: cst.CSTNode, names: frozenset[str] | set[str]) -> list[cst.Call]:
    return [n for n in _walk(root) if isinstance(n, cst.Call) and callee_name(n.func) in names]


def _trains(root: cst.CSTNode) -> bool:
    return any(isinstance(c.func, cst.Attribute) for c in _calls_named(root, _TRAINS))


def _span(wrapper: MetadataWrapper, node: cst.CSTNode) -> tuple[int, int]:
    where = wrapper.resolve(PositionProvider)[node]
    return where.start.line, where.end.line


def _holds(wrapper: MetadataWrapper, node: cst.CSTNode, line: int) -> bool:
    start, end = _span(wrapper, node)
    return bool(line) and start <= line <= end


def _indented(node: cst.CSTNode) -> list[cst.BaseStatement]:
    body = getattr(node, "body", None)
    if isinstance(body, cst.IndentedBlock):
        return list(body.body)
    if isinstance(node, cst.Module):
        return list(node.body)
    raise EditError("the block is written on one line, so a statement cannot be added to it")


def _with_statements(node: cst.CSTNode, body: Sequence[cst.BaseStatement]) -> cst.CSTNode:
    if isinstance(node, cst.Module):
        return node.with_changes(body=list(body))
    block = node.body  # type: ignore[attr-defined]
    return node.with_changes(body=block.with_changes(body=list(body)))


def _index(body: Sequence[cst.CSTNode], node: cst.CSTNode) -> int:
    """Where ``node`` itself (not an equal node) is in ``body``."""
    return next(i for i, s in enumerate(body) if s is node)


def _owner_of(stmt: cst.CSTNode, parents: Any) -> cst.CSTNode:
    """The node whose statement list holds ``stmt`` (a compound statement or the module)."""
    parent = parents.get(stmt)
    if isinstance(parent, cst.IndentedBlock):
        parent = parents.get(parent)
    if parent is None or stmt not in _indented(parent):
        raise EditError("the line is not inside a block of statements")
    return parent


def _insert(
    owner: cst.CSTNode, anchor: cst.BaseStatement, before: str = "", after: str = "", wrap: str = ""
) -> cst.CSTNode:
    """``owner`` with statements added around ``anchor`` (the comments above ``anchor`` move up to stay
    above the first new line), or ``anchor`` wrapped in ``with WRAP:``."""
    body = _indented(owner)
    i = _index(body, anchor)
    new: list[cst.BaseStatement] = []
    lead = getattr(anchor, "leading_lines", ())
    if wrap:
        inner = anchor.with_changes(leading_lines=())
        anchor = cst.With(
            items=[cst.WithItem(item=cst.parse_expression(wrap))], body=cst.IndentedBlock(body=[inner])
        )
    else:
        anchor = anchor.with_changes(leading_lines=())
    if before:
        new.extend(_statements(before))
    new.append(anchor)
    if after:
        new.extend(_statements(after))
    new[0] = new[0].with_changes(leading_lines=lead)
    body[i : i + 1] = new
    return _with_statements(owner, body)


def _has_torch(module: cst.Module) -> None:
    for s in module.body:
        if (
            isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], cst.Import)
            and any(dotted(n.name) == "torch" and n.asname is None for n in s.body[0].names)
        ):
            return
    raise EditError("the file has no top-level 'import torch' to call torch.no_grad through")


def _expr_call(stmt: cst.CSTNode) -> cst.Call | None:
    """The call of a statement that is one call (``opt.step()``), else None."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            return small.value
    return None


def _method_call(stmt: cst.CSTNode, method: str) -> tuple[str, cst.Call] | None:
    """``("model", call)`` for the statement ``model.eval()`` when ``method`` is ``eval``."""
    call = _expr_call(stmt)
    if call is not None and isinstance(call.func, cst.Attribute) and call.func.attr.value == method:
        return _code(call.func.value), call
    return None


# ---- sampler-set-epoch-missing ---------------------------------------------------------------


def _iterated(node: cst.BaseExpression) -> str:
    """The loader a ``for`` iterates: ``loader`` in ``loader``, ``enumerate(loader)``, ``tqdm(loader)``."""
    if isinstance(node, cst.Call) and node.args and node.args[0].keyword is None and not node.args[0].star:
        node = node.args[0].value
    if isinstance(node, cst.Name | cst.Attribute) and dotted(node):
        return _code(node)
    raise EditError("the loop does not iterate a named DataLoader")


def _assignments(
    module: cst.Module, parents: Any, scope: cst.CSTNode | None
) -> Iterator[tuple[str, cst.Call]]:
    """``(target, call)`` for each ``TARGET = CALL(...)`` in ``scope`` (its own body, not nested scopes)."""
    for node in _walk(scope if scope is not None else module):
        if (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and isinstance(node.value, cst.Call)
            and _scope_of(node, parents) is scope
        ):
            yield _code(node.targets[0].target), node.value


def _kwarg(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def _sampler_of(loader: str, module: cst.Module, parents: Any, scope: cst.CSTNode | None) -> str:
    """What to call ``set_epoch`` on for ``loader``: the name passed as its ``sampler=``, or
    ``loader.sampler`` when the DistributedSampler is built inside the DataLoader call."""
    built = [
        c
        for t, c in _assignments(module, parents, scope)
        if t == loader and callee_name(c.func) == "DataLoader"
    ]
    if len(built) != 1:
        raise EditError(
            f"{loader} is not built once by a DataLoader(...) call in the same function as its loop"
        )
    sampler = _kwarg(built[0], "sampler")
    if isinstance(sampler, cst.Call) and callee_name(sampler.func) == "DistributedSampler":
        return f"{loader}.sampler"
    if isinstance(sampler, cst.Name | cst.Attribute) and dotted(sampler):
        return _code(sampler)
    raise EditError(f"the DataLoader {loader} is given no sampler= argument to name")


def _loader_of(sampler: str, module: cst.Module, parents: Any, scope: cst.CSTNode | None) -> str:
    """The one DataLoader built with ``sampler=SAMPLER`` in ``scope``."""
    loaders = [
        t
        for t, c in _assignments(module, parents, scope)
        if callee_name(c.func) == "DataLoader"
        and (s := _kwarg(c, "sampler")) is not None
        and _code(s) == sampler
    ]
    if len(loaders) != 1:
        raise EditError(f"{_count(len(loaders), 'DataLoader')} built with sampler={sampler} in that function")
    return loaders[0]


def _count(n: int, what: str) -> str:
    return f"no {what} is" if n == 0 else f"{n} {what}s are"


def _set_epoch(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    stmt, _ = _statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    if _method_call(stmt, "set_epoch") is not None:  # the line this fix inserted (it moved the loop down)
        return None
    scope = _scope_of(stmt, parents)
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
        target, call = _code(small.targets[0].target), small.value
        if callee_name(call.func) == "DistributedSampler":
            sampler, loader = target, _loader_of(target, module, parents, scope)
        elif callee_name(call.func) == "DataLoader":
            sampler, loader = _sampler_of(target, module, parents, scope), target
        else:
            raise EditError(f"line {edit.line} does not build the DistributedSampler")
        loops = [
            n
            for n in _walk(scope if scope is not None else module)
            if isinstance(n, cst.For) and _loops_over(n, loader)
        ]
        if len(loops) != 1:
            raise EditError(f"{_count(len(loops), 'loop')} over {loader} in that function")
        inner = loops[0]
    outer = next(
        (a for a in _ancestors(inner, parents) if isinstance(a, cst.For | cst.While | cst.FunctionDef)), None
    )
    if not isinstance(outer, cst.For) or _scope_of(outer, parents) is not scope:
        raise EditError("the loop over the DataLoader is not inside a for loop over the epochs")
    if not isinstance(outer.target, cst.Name):
        raise EditError("the epoch loop's target is not one plain name to pass to set_epoch")
    body = _indented(outer)
    if any(".set_epoch(" in _code(s) for s in body):
        return None
    new = _insert(outer, body[0], before=f"{sampler}.set_epoch({outer.target.value})\n")
    return module.visit(_Replace(outer, new))


def _loops_over(loop: cst.For, loader: str) -> bool:
    try:
        return _iterated(loop.iter) == loader
    except EditError:
        return False


# ---- eval-without-no-grad / eval-in-train-mode -----------------------------------------------


def _local_names(module: cst.Module) -> set[str]:
    """Names bound by imports, ``def`` and ``class`` anywhere in the file: callables, not models."""
    names: set[str] = set()
    for node in _walk_all(module):
        if isinstance(node, cst.FunctionDef | cst.ClassDef):
            names.add(node.name.value)
        elif isinstance(node, cst.Import | cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                bound = alias.asname.name if alias.asname else alias.name
                names.add(dotted(bound).split(".")[0] if isinstance(bound, cst.BaseExpression) else "")
    return names


class _All(cst.CSTVisitor):
    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return True


def _walk_all(root: cst.CSTNode) -> list[cst.CSTNode]:
    v = _All()
    root.visit(v)
    return v.nodes


def _model_called(module: cst.Module, stmt: cst.CSTNode, line: int) -> str:
    """The model the statement calls: the one call of a plain name (or ``self.NAME``) that is no
    builtin, import, function or class of the file (``model`` in ``loss = F.cross_entropy(model(x), y)``)."""
    skip = _local_names(module) | set(dir(builtins))
    models = {
        _code(c.func)
        for c in _walk(stmt)
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
        isinstance(c.func, cst.Attribute) and c.func.attr.value == method and _code(c.func.value) == model
        for c in _calls_named(root, {method})
    )


def _in_function(func: cst.FunctionDef, start: str, end: str) -> cst.FunctionDef:
    """``func`` with ``start`` after its docstring and ``end`` as its last statement, before a final
    ``return`` (a function with another ``return`` is refused: the end would be skipped)."""
    body = _indented(func)
    returns = [n for n in _walk(func) if isinstance(n, cst.Return)]
    last_is_return = isinstance(body[-1], cst.SimpleStatementLine) and isinstance(
        body[-1].body[0], cst.Return
    )
    if len(returns) > 1 or (returns and not last_is_return):
        raise EditError(
            f"{func.name.value}() returns from more than one place, so the model's mode cannot be restored"
        )
    first = 1 if _is_docstring(body[0]) else 0
    new = [*body[:first], *_statements(start), *body[first:]]
    at = len(new) - 1 if last_is_return else len(new)
    new[at:at] = _statements(end)
    return func.with_changes(body=func.body.with_changes(body=new))


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def _no_grad(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    options = dict(edit.kwargs)
    train_line, eval_mode = int(options.get("train_line") or 0), bool(options.get("eval_mode"))
    stmt, _ = _statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    # The line itself may be the block: what this fix inserted above it moved it down.
    for a in [stmt, *_ancestors(stmt, parents)]:
        if _is_no_grad_with(a) or (isinstance(a, cst.FunctionDef) and _no_grad_decorated(a)):
            return None
    _has_torch(module)
    if train_line == edit.line:
        raise EditError(f"line {edit.line} also runs the training forward, so it cannot go under no_grad")
    model = _model_called(module, stmt, edit.line) if eval_mode else ""
    func = _scope_of(stmt, parents)
    if isinstance(func, cst.FunctionDef) and not _trains(func) and not _holds(wrapper, func, train_line):
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
        return module.visit(_Replace(func, new))
    # Inside the training function (or at module level): the innermost loop holding the forward that
    # does not train, else the statement alone.
    block: cst.CSTNode = stmt
    for a in _ancestors(stmt, parents):
        if isinstance(a, cst.FunctionDef | cst.ClassDef):
            break
        if isinstance(a, cst.For | cst.While):
            if not _trains(a) and not _holds(wrapper, a, train_line):
                block = a
            break
    if block is stmt and not isinstance(stmt, cst.SimpleStatementLine):
        raise EditError(
            f"line {edit.line} opens a block that also does other things; no_grad cannot wrap it alone"
        )
    owner = _owner_of(block, parents)
    before = after = ""
    if eval_mode and not _calls_method_on_before(owner, block, model):
        before, after = f"{model}.eval()\n", f"{model}.train()\n"
    new_owner = _insert(owner, block, before=before, after=after, wrap="torch.no_grad()")  # type: ignore[arg-type]
    return module.visit(_Replace(owner, new_owner))


def _calls_method_on_before(owner: cst.CSTNode, block: cst.CSTNode, model: str) -> bool:
    """True when a statement before ``block`` in its block is ``MODEL.eval()``."""
    body = _indented(owner)
    return any(
        (m := _method_call(s, "eval")) is not None and m[0] == model for s in body[: _index(body, block)]
    )


def _eval_mode(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    stmt, _ = _statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    if _method_call(stmt, "eval") is not None:  # the line this fix inserted (it moved the forward down)
        return None
    model = _model_called(module, stmt, edit.line)
    # The line itself may be the block: this fix's model.eval() above it moved it down a line.
    for a in [stmt, *_ancestors(stmt, parents)]:
        if _is_no_grad_with(a):
            owner = _owner_of(a, parents)
            body = _indented(owner)
            i = _index(body, a)
            if i and (m := _method_call(body[i - 1], "eval")) is not None and m[0] == model:
                return None
            new = _insert(owner, a, before=f"{model}.eval()\n", after=f"{model}.train()\n")  # type: ignore[arg-type]
            return module.visit(_Replace(owner, new))
        if isinstance(a, cst.FunctionDef):
            if not _no_grad_decorated(a):
                break
            if _calls_method_on(a, model, "eval"):
                return None
            return module.visit(_Replace(a, _in_function(a, f"{model}.eval()\n", f"{model}.train()\n")))
    raise EditError(f"no torch.no_grad() block or decorator around line {edit.line} in this file")


# ---- loss-graph-retained ---------------------------------------------------------------------


def _backward_loss(stmt: cst.CSTNode, line: int) -> str:
    """``loss`` for ``loss.backward()``, ``(loss / k).backward()``, ``scaler.scale(loss).backward()``."""
    calls = [
        c
        for c in _walk(stmt)
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


def _is_name(node: cst.BaseExpression, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _is_fixed(node: cst.BaseExpression, loss: str) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in ("item", "detach")
        and _is_name(node.func.value, loss)
    )


def _used_as_tensor(module: cst.Module, target: cst.BaseExpression) -> bool:
    """True unless ``target`` is a plain name the file never reads an attribute of or indexes
    (``total.item()``): only then may it become a Python float."""
    if not isinstance(target, cst.Name):
        return True
    return any(
        isinstance(n, cst.Attribute | cst.Subscript) and _is_name(n.value, target.value)
        for n in _walk_all(module)
    )


def _detach_kept(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    stmt, _ = _statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    loss = _backward_loss(stmt, edit.line)
    scope = next(
        (a for a in _ancestors(stmt, parents) if isinstance(a, cst.For | cst.While | cst.FunctionDef)), module
    )
    found, fixed = [], 0
    for node in _walk(scope):
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                kept = _kept(small, loss)
                if kept is None:
                    continue
                if _is_name(kept[1], loss):
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
    return module.visit(_ReplaceAll(replace))


class _ReplaceAll(cst.CSTTransformer):
    """Each node of ``replace`` (by identity) by its new node, in one pass."""

    def __init__(self, replace: dict[cst.CSTNode, cst.CSTNode]) -> None:
        self.replace = {id(k): v for k, v in replace.items()}

    def on_leave(self, original: Any, updated: Any) -> Any:
        return self.replace.get(id(original), updated)


# ---- clip-before-unscale ---------------------------------------------------------------------


def _unscale_before_clip(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    stmt, _ = _statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    if _method_call(stmt, "unscale_") is not None:  # the line this fix inserted (it moved the clip down)
        return None
    if not isinstance(stmt, cst.SimpleStatementLine) or not _calls_named(
        stmt, {"clip_grad_norm_", "clip_grad_value_"}
    ):
        raise EditError(f"line {edit.line} does not clip gradients")
    scalers = {
        _code(c.func.value) for c in _calls_named(module, {"scale"}) if isinstance(c.func, cst.Attribute)
    }
    owner = _owner_of(stmt, parents)
    body = _indented(owner)
    i = _index(body, stmt)
    if i and _method_call(body[i - 1], "unscale_") is not None:
        return None
    # The scaler.step(opt) after the clip: in the same block, or after the block the clip sits in
    # (``if clip: ...``), up to the loop or function around it.
    steps: list[tuple[str, str]] = []
    node: cst.CSTNode = stmt
    while not steps:
        holder = _owner_of(node, parents)
        siblings = _indented(holder)
        for s in siblings[_index(siblings, node) + 1 :]:
            m = _method_call(s, "step")
            if m is not None and m[0] in scalers and len(m[1].args) == 1 and m[1].args[0].keyword is None:
                steps.append((m[0], _code(m[1].args[0].value)))
        if isinstance(holder, cst.For | cst.While | cst.FunctionDef | cst.Module) or steps:
            break
        node = holder
    if len(steps) != 1:
        raise EditError(
            f"no one SCALER.step(OPTIMIZER) follows the clipping at line {edit.line} to name them"
        )
    scaler, opt = steps[0]
    new = _insert(owner, stmt, before=f"{scaler}.unscale_({opt})\n")
    return module.visit(_Replace(owner, new))


# ---- train-loader-not-shuffled ----------------------------------------------------------------


def _shuffle(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    stmt, _ = _statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    if not isinstance(stmt, cst.For):
        raise EditError(f"line {edit.line} does not loop over a DataLoader")
    loader, scope = _iterated(stmt.iter), _scope_of(stmt, parents)
    built = [
        c
        for t, c in _assignments(module, parents, scope)
        if t == loader and callee_name(c.func) == "DataLoader"
    ]
    if len(built) != 1:
        raise EditError(
            f"{loader} is not built once by a DataLoader(...) call in the same function as its loop"
        )
    target = built[0]
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
    new = _set_kwargs(
        target, Edit(kind="call_kwargs", callee=callee_name(target.func), kwargs=(("shuffle", True),))
    )
    return module.visit(_Replace(target, new))


# ---- module-in-plain-container, tensor-attribute-not-registered, super-init-missing --------------


def _self_assign(stmt: cst.CSTNode, line: int) -> tuple[cst.SimpleStatementLine, cst.Assign, str]:
    """The statement ``self.NAME = VALUE`` at the line, its assignment and ``NAME``."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Attribute)
        and _is_name(small.targets[0].target.value, "self")
    ):
        return stmt, small, small.targets[0].target.attr.value  # type: ignore[return-value]
    raise EditError(f"line {line} is not one 'self.NAME = ...' assignment")


def _nn(module: cst.Module) -> str:
    """How the file names ``torch.nn``: ``nn`` (``from torch import nn``, ``import torch.nn as nn``)
    or ``torch.nn`` (``import torch``)."""
    names: set[str] = set()
    for node in _walk(module):
        if isinstance(node, cst.ImportFrom) and node.module is not None and dotted(node.module) == "torch":
            if not isinstance(node.names, cst.ImportStar):
                names |= {"nn" for a in node.names if _code(a.name) == "nn" and a.asname is None}
        elif isinstance(node, cst.Import):
            for a in node.names:
                if _code(a.name) == "torch.nn" and a.asname is not None and _code(a.asname.name) == "nn":
                    names.add("nn")
                elif _code(a.name) == "torch" and a.asname is None:
                    names.add("torch.nn")
    if "nn" in names:
        return "nn"
    if "torch.nn" in names:
        return "torch.nn"
    raise EditError("the file imports neither torch nor torch.nn as nn at its top level")


def _module_container(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    stmt, _ = _statement_at(wrapper, edit.line)
    _, assign, name = _self_assign(stmt, edit.line)
    value = assign.value
    if isinstance(value, cst.Call) and callee_name(value.func) in ("ModuleList", "ModuleDict", "Sequential"):
        return None
    if isinstance(value, cst.List | cst.ListComp | cst.Tuple | cst.GeneratorExp):
        wrapper_name = "ModuleList"
        empty = isinstance(value, cst.List | cst.Tuple) and not value.elements
    elif isinstance(value, cst.Dict | cst.DictComp) or (
        isinstance(value, cst.Call) and _is_name(value.func, "dict")
    ):
        wrapper_name = "ModuleDict"
        empty = isinstance(value, cst.Dict) and not value.elements
    else:
        raise EditError(f"self.{name} at line {edit.line} is not a list, tuple or dict display")
    func = cst.parse_expression(f"{_nn(module)}.{wrapper_name}")
    new = cst.Call(func=func, args=[] if empty else [cst.Arg(value=value)])
    return module.visit(_Replace(assign, assign.with_changes(value=new)))


def _register_buffer(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    stmt, _ = _statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    done = _expr_call(stmt)
    if done is not None and callee_name(done.func) == "register_buffer":
        return None
    line, assign, name = _self_assign(stmt, edit.line)
    func = _scope_of(stmt, parents)
    if not (isinstance(func, cst.FunctionDef) and func.name.value == "__init__"):
        raise EditError(f"self.{name} is assigned outside __init__, where register_buffer would run again")
    call = cst.parse_expression(f'self.register_buffer("{name}", _)')
    assert isinstance(call, cst.Call)
    call = call.with_changes(args=[call.args[0], call.args[1].with_changes(value=assign.value)])
    return module.visit(_Replace(line, line.with_changes(body=[cst.Expr(value=call)])))


def _is_super_init(stmt: cst.CSTNode) -> bool:
    """``super().__init__(...)``, ``nn.Module.__init__(self)``, ``Base.__init__(self, ...)``."""
    call = _expr_call(stmt)
    return call is not None and isinstance(call.func, cst.Attribute) and call.func.attr.value == "__init__"


def _free_names(node: cst.CSTNode) -> set[str]:
    """The names ``node`` reads (``x`` in ``f(x.y)``; not the attribute ``y``)."""
    attrs = {id(n.attr) for n in _walk(node) if isinstance(n, cst.Attribute)}
    return {n.value for n in _walk(node) if isinstance(n, cst.Name) and id(n) not in attrs}


def _super_init_first(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    stmt, _ = _statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    func = stmt if isinstance(stmt, cst.FunctionDef) else _scope_of(stmt, parents)
    cls = _scope_of(func, parents) if func is not None else None
    if not (
        isinstance(func, cst.FunctionDef) and func.name.value == "__init__" and isinstance(cls, cst.ClassDef)
    ):
        raise EditError(f"line {edit.line} is not in a class's __init__")
    body = _indented(func)
    first = 1 if _is_docstring(body[0]) else 0
    if first < len(body) and _is_super_init(body[first]):
        return None
    calls = [s for s in body if _is_super_init(s)]
    elsewhere = any(
        isinstance(n, cst.Attribute) and n.attr.value == "__init__"
        for s in body
        if not _is_super_init(s)
        for n in _walk(s)
    )
    if len(calls) > 1 or elsewhere:
        raise EditError(f"{cls.name.value}.__init__ calls the base __init__ where fix cannot move it from")
    if calls:  # later in the body: moved up, when it reads nothing but the parameters
        call = _expr_call(calls[0])
        assert call is not None
        # ``self`` itself (``nn.Module.__init__(self)``), never what was set on it before the call
        allowed = {p.name.value for p in func.params.params} - {"self"}
        reads = set().union(*(_free_names(a.value) for a in call.args if not _is_name(a.value, "self")))
        if not reads <= allowed:
            raise EditError("the base __init__ call uses values computed before it; move it up by hand")
        add = calls[0]
        rest = [s for s in body if s is not add]
    else:
        bases = [dotted(b.value) for b in cls.bases]
        if len(bases) != 1 or bases[0].split(".")[-1] != "Module":
            raise EditError(
                f"{cls.name.value} is not a direct nn.Module subclass, so its base may need arguments"
            )
        add, rest = _statements("super().__init__()\n")[0], body
    if first == len(rest):  # an __init__ holding only its docstring
        new = [*rest, add]
    else:
        head = rest[first]
        lead = [*getattr(head, "leading_lines", ()), *getattr(add, "leading_lines", ())]
        new = [
            *rest[:first],
            add.with_changes(leading_lines=lead),
            head.with_changes(leading_lines=()),
            *rest[first + 1 :],
        ]
    return module.visit(_Replace(func, func.with_changes(body=func.body.with_changes(body=new))))


# ---- empty-cache-in-loop, cudnn-disabled ----------------------------------------------------------

DELETABLE = {
    "empty_cache": "torch.cuda.empty_cache()",
    "cudnn.enabled": "torch.backends.cudnn.enabled = False",
}
"""What ``delete_statement`` removes, by its ``callee``: the statement the rule flags (any alias of
the module in front, as the rules accept them)."""


def _deletable(stmt: cst.CSTNode, what: str) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    if what == "empty_cache":
        call = _expr_call(stmt)
        return call is not None and not call.args and _code(call.func).endswith("empty_cache")
    return (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and _code(small.targets[0].target).endswith("cudnn.enabled")
        and _code(small.value) in ("False", "0")
    )


def _delete_statement(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    what = edit.callee
    stmt, _ = _statement_at(wrapper, edit.line)
    if not _deletable(stmt, what):
        if not any(_deletable(n, what) for n in _walk_all(module)):
            return None  # deleted already (the line now holds what came after it)
        raise EditError(f"line {edit.line} is not the statement {DELETABLE[what]}")
    parents = wrapper.resolve(ParentNodeProvider)
    owner = _owner_of(stmt, parents)
    body = _indented(owner)
    i = _index(body, stmt)
    lead = list(getattr(stmt, "leading_lines", ()))
    rest = [*body[:i], *body[i + 1 :]]
    if i < len(rest):  # the comments above it stay, above the statement after it
        nxt = rest[i]
        rest[i] = nxt.with_changes(leading_lines=[*lead, *getattr(nxt, "leading_lines", ())])
    elif any(line.comment is not None for line in lead):
        raise EditError(f"a comment above line {edit.line} would be left at the end of its block")
    if not rest:
        if isinstance(owner, cst.Module):
            return cst.Module(body=[], header=module.header, footer=module.footer)
        rest = _statements("pass\n")
    return module.visit(_Replace(owner, _with_statements(owner, rest)))


Editor = Callable[[cst.Module, MetadataWrapper, Edit], "cst.Module | None"]


def _guarded(editor: Editor) -> Editor:
    """``editor``, with a code shape it was not written for refused in one sentence (``not patched``)
    instead of failing the whole ``scalpel fix`` run with a traceback."""

    def edit(module: cst.Module, wrapper: MetadataWrapper, e: Edit) -> cst.Module | None:
        try:
            return editor(module, wrapper, e)
        except EditError:
            raise
        except (AttributeError, IndexError, KeyError, StopIteration, TypeError, ValueError) as exc:
            raise EditError(f"fix cannot read the code around line {e.line} ({type(exc).__name__})") from None

    return edit


EDITORS: dict[str, Editor] = {
    kind: _guarded(editor)
    for kind, editor in {
        "set_epoch": _set_epoch,
        "no_grad": _no_grad,
        "eval_mode": _eval_mode,
        "detach_kept": _detach_kept,
        "unscale_before_clip": _unscale_before_clip,
        "shuffle": _shuffle,
        "module_container": _module_container,
        "register_buffer": _register_buffer,
        "super_init_first": _super_init_first,
        "delete_statement": _delete_statement,
    }.items()
}
"""The editor of each kind in :data:`KINDS`."""

"""The libcst helpers the doctor-finding editors share (:mod:`torchscalpel.fix.edits_doctor`): walking
a scope without entering nested ones, finding the block that holds a statement, and inserting
statements around one while the comments above it stay above.

Each raises :class:`~torchscalpel.fix.edits.EditError` (``not patched``) for a code shape it cannot
handle, like the editors that use them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from torchscalpel.fix.edits import EditError, callee_name, statements_of


def node_code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def ancestors(node: cst.CSTNode, parents: Any) -> Iterator[cst.CSTNode]:
    node = parents.get(node)
    while node is not None:
        yield node
        node = parents.get(node)


def scope_of(node: cst.CSTNode, parents: Any) -> cst.CSTNode | None:
    """The innermost function or class holding ``node`` (None: module level)."""
    return next((a for a in ancestors(node, parents) if isinstance(a, cst.FunctionDef | cst.ClassDef)), None)


_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


class _Walk(cst.CSTVisitor):
    """Every node under a root, without entering nested functions, classes or lambdas."""

    def __init__(self, root: cst.CSTNode) -> None:
        self.root, self.nodes = root, []  # type: ignore[var-annotated]

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return node is self.root or not isinstance(node, _SCOPES)


def walk_nodes(root: cst.CSTNode) -> list[cst.CSTNode]:
    """Every node under ``root``, without entering the functions, classes or lambdas it holds."""
    walker = _Walk(root)
    root.visit(walker)
    return list(walker.nodes)


class _All(cst.CSTVisitor):
    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return True


def walk_all(root: cst.CSTNode) -> list[cst.CSTNode]:
    """Every node under ``root``, nested functions and classes included (a checkpoint reader is anywhere)."""
    v = _All()
    root.visit(v)
    return v.nodes


def calls_named(root: cst.CSTNode, names: frozenset[str] | set[str]) -> list[cst.Call]:
    return [n for n in walk_nodes(root) if isinstance(n, cst.Call) and callee_name(n.func) in names]


def _span(wrapper: MetadataWrapper, node: cst.CSTNode) -> tuple[int, int]:
    where = wrapper.resolve(PositionProvider)[node]
    return where.start.line, where.end.line


def holds_name(wrapper: MetadataWrapper, node: cst.CSTNode, line: int) -> bool:
    start, end = _span(wrapper, node)
    return bool(line) and start <= line <= end


def indented_code(node: cst.CSTNode) -> list[cst.BaseStatement]:
    body = getattr(node, "body", None)
    if isinstance(body, cst.IndentedBlock):
        return list(body.body)
    if isinstance(node, cst.Module):
        return list(node.body)
    raise EditError("the block is written on one line, so a statement cannot be added to it")


def with_statements(node: cst.CSTNode, body: Sequence[cst.BaseStatement]) -> cst.CSTNode:
    if isinstance(node, cst.Module):
        return node.with_changes(body=list(body))
    block = node.body  # type: ignore[attr-defined]
    return node.with_changes(body=block.with_changes(body=list(body)))


def index_in(body: Sequence[cst.CSTNode], node: cst.CSTNode) -> int:
    """Where ``node`` itself (not an equal node) is in ``body``."""
    return next(i for i, s in enumerate(body) if s is node)


def owner_of(stmt: cst.CSTNode, parents: Any) -> cst.CSTNode:
    """The node whose statement list holds ``stmt`` (a compound statement or the module)."""
    parent = parents.get(stmt)
    if isinstance(parent, cst.IndentedBlock):
        parent = parents.get(parent)
    if parent is None or stmt not in indented_code(parent):
        raise EditError("the line is not inside a block of statements")
    return parent


def insert_at(
    owner: cst.CSTNode, anchor: cst.BaseStatement, before: str = "", after: str = "", wrap: str = ""
) -> cst.CSTNode:
    """``owner`` with statements added around ``anchor`` (the comments above ``anchor`` move up to stay
    above the first new line), or ``anchor`` wrapped in ``with WRAP:``."""
    body = indented_code(owner)
    i = index_in(body, anchor)
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
        new.extend(statements_of(before))
    new.append(anchor)
    if after:
        new.extend(statements_of(after))
    new[0] = new[0].with_changes(leading_lines=lead)
    body[i : i + 1] = new
    return with_statements(owner, body)


def expr_call(stmt: cst.CSTNode) -> cst.Call | None:
    """The call of a statement that is one call (``opt.step()``), else None."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            return small.value
    return None


def method_call(stmt: cst.CSTNode, method: str) -> tuple[str, cst.Call] | None:
    """``("model", call)`` for the statement ``model.eval()`` when ``method`` is ``eval``."""
    call = expr_call(stmt)
    if call is not None and isinstance(call.func, cst.Attribute) and call.func.attr.value == method:
        return node_code(call.func.value), call
    return None


def is_name(node: cst.BaseExpression, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


class ReplaceAll(cst.CSTTransformer):
    """Each node of ``replace`` (by identity) by its new node, in one pass."""

    def __init__(self, replace: dict[cst.CSTNode, cst.CSTNode]) -> None:
        self.replace = {id(k): v for k, v in replace.items()}

    def on_leave(self, original: Any, updated: Any) -> Any:
        return self.replace.get(id(original), updated)

"""What every editor of ``scalpel fix`` shares: the edit types (:class:`Edit`, :class:`Outcome`,
:class:`EditError`, the :data:`Editor` signature) and the libcst helpers the editors
(:mod:`torchscalpel.fix.editors`) build on: finding the call or the statement at a recorded line,
setting a call's keyword arguments, replacing nodes, walking a scope without entering nested ones,
and inserting statements around one while the comments above it stay above.

A helper raises :class:`EditError` (``not patched``) for a code shape it cannot handle, like the
editors that use it. Nothing here knows an edit kind: :mod:`torchscalpel.fix.edits` maps each kind
to its editor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, ParentNodeProvider, PositionProvider

from torchscalpel.fix.code import value as code_value


@dataclass(frozen=True, slots=True)
class Edit:
    """One change to one file, anchored at a recorded line."""

    kind: str
    """One of :data:`torchscalpel.fix.edits.EDIT_KINDS` (``call_kwargs``, ``autocast``, ``save_state_dict``,
    ...): which editor makes it."""
    line: int = 0
    """The anchor line the run recorded (0 for the file-wide kinds)."""
    callee: str = ""
    """The called name the anchored call must end in (``AdamW``, ``DataLoader``, ``load``, ``save``)."""
    kwargs: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments to set (``call_kwargs``, ``call_anywhere``)."""
    drop: tuple[str, ...] = ()
    """Keyword arguments to remove when they are there (``foreach`` when ``fused`` is set)."""
    code: str = ""
    """The statement(s) to insert (``global_call``, ``after_statement``) or the ``with`` header's call
    (``autocast``)."""
    end_line: int = 0
    """``autocast``: the backward's line (the wrapped statements stop before it)."""
    marker: str = ""
    """``after_statement``: text whose presence in the following statement means already inserted."""
    anchors: tuple[tuple[str, int], ...] = ()
    """More recorded lines the edit needs, by role (``grad_scaler``: ``forward``, ``backward``, ``step``)."""


@dataclass(slots=True)
class Outcome:
    """What an edit did: ``applied``, ``already`` (the code was already so) or ``refused`` with why."""

    status: str
    reason: str = ""
    lines: tuple[int, ...] = field(default=())


class EditError(Exception):
    """An edit that cannot be placed safely; the message is the reason shown as ``not patched``."""


Editor = Callable[[cst.Module, MetadataWrapper, Edit], "cst.Module | None"]
"""An editor: the module with the edit made, None when the code already does it (``already``);
raises :class:`EditError` when the edit cannot be placed."""


def literal(value: Any) -> cst.BaseExpression:
    """A Python literal as an expression node (True, 2, "bf16-mixed": strings in double quotes, as
    most formatters write them), built from the value's type (:func:`torchscalpel.fix.code.value`),
    never parsed from its text."""
    return code_value(value)


def callee_name(func: cst.BaseExpression) -> str:
    """The last name of a called expression: ``AdamW`` for ``torch.optim.AdamW``, ``load`` for ``torch.load``."""
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return ""


def dotted(node: cst.BaseExpression) -> str:
    """``torch.optim.AdamW`` for an attribute chain of names ("" otherwise)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr.value}" if head else ""
    return ""


class _Calls(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, callee: str, line: int) -> None:
        self.callee, self.line = callee, line
        self.found: list[tuple[cst.Call, CodeRange]] = []

    def visit_Call(self, node: cst.Call) -> None:
        if callee_name(node.func) != self.callee:
            return
        where = self.get_metadata(PositionProvider, node)
        if self.line == 0 or where.start.line <= self.line <= where.end.line:
            self.found.append((node, where))


def find_call(wrapper: MetadataWrapper, callee: str, line: int) -> cst.Call:
    """The one call of ``callee`` whose span holds ``line`` (``line`` 0: the one in the file); two or none:
    :class:`EditError`."""
    visitor = _Calls(callee, line)
    wrapper.visit(visitor)
    if line:
        # The innermost call of that name holding the line: a call nested in the argument list of
        # another one of the same name is the one that started on it.
        starting = [c for c, r in visitor.found if r.start.line == line] or [c for c, _ in visitor.found]
        if len(starting) != 1:
            raise EditError(f"line {line} holds {_calls(len(starting))} of {callee}")
        return starting[0]
    if len(visitor.found) != 1:
        raise EditError(f"the file has {_calls(len(visitor.found))} of {callee}")
    return visitor.found[0][0]


def _calls(n: int) -> str:
    return "no call" if n == 0 else f"{n} calls"


def same_code(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """True when the two nodes print as the same code."""
    return cst.Module(body=[]).code_for_node(a) == cst.Module(body=[]).code_for_node(b)


def set_kwargs(call: cst.Call, edit: Edit) -> cst.Call:
    """``call`` with ``edit.kwargs`` set and ``edit.drop`` removed, the call's own layout kept (a multi-line
    call gets the new argument on a line of its own)."""
    args = list(call.args)
    if any(a.star for a in args) and not all(a.keyword is not None or not a.star for a in args):
        raise EditError(f"the {edit.callee} call passes **kwargs, so its arguments cannot be read here")
    kept = [a for a in args if not (a.keyword is not None and a.keyword.value in edit.drop)]
    if kept and args and kept[-1] is not args[-1]:  # the last argument went: its comma (or none) moves up
        kept[-1] = kept[-1].with_changes(comma=args[-1].comma)
    args = kept
    for key, value in edit.kwargs:
        node = literal(value)
        for i, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value == key:
                args[i] = arg.with_changes(value=node)
                break
        else:
            if any(a.star == "**" for a in args):
                raise EditError(f"the {edit.callee} call passes **kwargs, which may already set {key}")
            last = args[-1] if args else None
            new = cst.Arg(
                keyword=cst.Name(key),
                value=node,
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
                ),
            )
            if last is not None:
                comma = last.comma
                if isinstance(comma, cst.Comma):  # a trailing comma (a multi-line call): the new
                    # argument takes over its comma and line break, on a line of its own indented as
                    # the arguments before it are (or on the last one's line when none breaks)
                    new = new.with_changes(comma=comma)
                    breaks = [
                        a.comma.whitespace_after
                        for a in args[:-1]
                        if isinstance(a.comma, cst.Comma)
                        and isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace)
                    ]
                    after: cst.BaseParenthesizableWhitespace = (
                        _line_break(breaks[-1]) if breaks else cst.SimpleWhitespace(" ")
                    )
                    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=after))
                else:
                    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(new)
    return call.with_changes(args=args)


def _line_break(like: cst.ParenthesizedWhitespace) -> cst.ParenthesizedWhitespace:
    """A line break indented as ``like``, without its comment (a comment belongs to its own line)."""
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(), empty_lines=(), indent=like.indent, last_line=like.last_line
    )


class Replace(cst.CSTTransformer):
    """``old`` (by identity) replaced by ``new``, in one pass."""

    def __init__(self, old: cst.CSTNode, new: cst.CSTNode) -> None:
        self.old, self.new = old, new

    def on_leave(self, original: Any, updated: Any) -> Any:
        return self.new if original is self.old else updated


def statement_at(wrapper: MetadataWrapper, line: int) -> tuple[cst.BaseStatement, cst.CSTNode]:
    """The innermost statement whose span holds ``line``, and the node holding its body list."""
    positions = wrapper.resolve(PositionProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    holding = [
        (where.end.line - where.start.line, where.end.column - where.start.column, node)
        for node, where in positions.items()
        if isinstance(node, cst.SimpleStatementLine | cst.BaseCompoundStatement)
        and where.start.line <= line <= where.end.line
    ]
    # The smallest span holding the line is the innermost statement (a loop holds its body's lines).
    best = min(holding, key=lambda h: (h[0], h[1]))[2] if holding else None
    if best is None:
        raise EditError(f"no statement holds line {line}")
    return best, parents[best]


def body_of(owner: cst.CSTNode) -> Sequence[cst.BaseStatement]:
    """The statement list of ``owner`` (a block, the module); :class:`EditError` when it has none."""
    body = getattr(owner, "body", None)
    if not isinstance(body, list | tuple):
        raise EditError("the line is not inside a block of statements")
    return body


def statements_of(code: str) -> list[cst.BaseStatement]:
    """``code`` parsed as statements, to insert."""
    return list(cst.parse_module(code).body)


def is_autocast_with(node: cst.CSTNode) -> bool:
    """True for a ``with ...autocast(...):`` block."""
    return isinstance(node, cst.With) and any(
        isinstance(item.item, cst.Call) and callee_name(item.item.func) == "autocast" for item in node.items
    )


def with_body(owner: cst.CSTNode, body: list[cst.BaseStatement]) -> cst.CSTNode:
    """``owner`` with its statement list replaced by ``body``."""
    return owner.with_changes(body=body)


def assigned_name(stmt: cst.BaseStatement) -> str:
    """``model`` for ``model = GPT().to(device)``; anything else cannot be named safely."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
    ):
        return small.targets[0].target.value
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None:
        return small.target.value
    raise EditError("the line does not assign what it builds to one plain name")


def step_receiver(module: cst.Module, stmt: cst.BaseStatement) -> str:
    """``opt`` for the statement ``opt.step()`` (``self.opt``, ``optimizers[0]`` are kept as written)."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    call = small.value if isinstance(small, cst.Expr) else None
    if (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "step"
        and isinstance(call.func.value, cst.Name | cst.Attribute | cst.Subscript)
    ):
        return module.code_for_node(call.func.value)
    raise EditError("the line is not a plain OPTIMIZER.step() call")


def node_code(node: cst.CSTNode) -> str:
    """The code a node prints as."""
    return cst.Module(body=[]).code_for_node(node)


def ancestors(node: cst.CSTNode, parents: Any) -> Iterator[cst.CSTNode]:
    """The parents of ``node``, innermost first (``parents``: libcst's ParentNodeProvider map)."""
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
    """The calls under ``root`` (not inside the functions, classes or lambdas it holds) of a name in
    ``names``."""
    return [n for n in walk_nodes(root) if isinstance(n, cst.Call) and callee_name(n.func) in names]


def _span(wrapper: MetadataWrapper, node: cst.CSTNode) -> tuple[int, int]:
    where = wrapper.resolve(PositionProvider)[node]
    return where.start.line, where.end.line


def holds_name(wrapper: MetadataWrapper, node: cst.CSTNode, line: int) -> bool:
    """True when ``node`` spans ``line`` (0 is no line)."""
    start, end = _span(wrapper, node)
    return bool(line) and start <= line <= end


def indented_code(node: cst.CSTNode) -> list[cst.BaseStatement]:
    """The statements of an indented block or the module; :class:`EditError` for a one-line block."""
    body = getattr(node, "body", None)
    if isinstance(body, cst.IndentedBlock):
        return list(body.body)
    if isinstance(node, cst.Module):
        return list(node.body)
    raise EditError("the block is written on one line, so a statement cannot be added to it")


def with_statements(node: cst.CSTNode, body: Sequence[cst.BaseStatement]) -> cst.CSTNode:
    """``node`` (a compound statement or the module) with its statements replaced by ``body``."""
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
    """True when ``node`` is the plain name ``name``."""
    return isinstance(node, cst.Name) and node.value == name


def is_docstring(stmt: cst.BaseStatement) -> bool:
    """True when ``stmt`` is a string literal alone (a docstring)."""
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

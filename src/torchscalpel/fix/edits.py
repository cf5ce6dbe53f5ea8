"""The source edits ``scalpel fix`` makes, one libcst transformation per kind, on source text.

Every edit is anchored at a line the run recorded (:mod:`torchscalpel.fix.locate`) and either
changes the code there, finds it already changed (``already``: running fix twice gives no diff), or
refuses with a reason (``not patched``): it never looks elsewhere for a likely-looking line. libcst
keeps everything it does not touch byte for byte (comments, blank lines, the user's layout).

The kinds:

- ``call_kwargs``: set keyword arguments on the call of ``callee`` whose span holds the line
  (optimizer ``fused=True``, DataLoader ``num_workers=2``, ``torch.load(weights_only=True)``,
  ``TrainingArguments(bf16=True)``); keys in ``drop`` are removed (``foreach`` when ``fused`` is set);
- ``call_anywhere``: the same on the one call of ``callee`` in the file (framework objects the run
  did not see being built: ``TrainingArguments``, Lightning's ``Trainer``); two calls: not patched;
- ``global_call``: a ``torch.*`` setting as a statement after the file's last top-level import;
- ``autocast``: the statements from the training forward up to (not including) the backward,
  wrapped in ``with torch.autocast(...)``;
- ``after_statement``: statements inserted after the one at the line (``model.compile()`` after the
  model is built, ``opt.zero_grad(set_to_none=True)`` after ``opt.step()``);
- ``save_state_dict`` (:mod:`torchscalpel.fix.edits_checkpoint`): ``torch.save(model, ...)`` saves
  ``model.state_dict()``, and each ``torch.load`` of that path in the file loads into the model;
- ``safe_load`` (the same module): ``weights_only=True`` on a ``torch.load``, with its writer when the
  file saves a whole module to that path;
- ``grad_scaler`` (:mod:`torchscalpel.fix.edits_amp`): fp16 autocast with a ``torch.amp.GradScaler``;
- ``fp32_attention_call`` (:mod:`torchscalpel.fix.edits_amp`): the user's own
  ``F.scaled_dot_product_attention`` call run in float32 while autocast is on (tune's ``amp_fp32_attention``);
- ``channels_last_inputs`` (:mod:`torchscalpel.fix.edits_layout`): the forward's 4-D inputs in
  channels_last;
- ``sdpa`` (:mod:`torchscalpel.fix.edits_attention`): hand-written attention as one
  ``F.scaled_dot_product_attention`` call, with the mask the code applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, ParentNodeProvider, PositionProvider

from torchscalpel.fix.code import value as code_value
from torchscalpel.fix.edits_memory import EDITORS as MEMORY_EDITORS


@dataclass(frozen=True, slots=True)
class Edit:
    """One change to one file, anchored at a recorded line."""

    kind: str
    """``call_kwargs``, ``call_anywhere``, ``global_call``, ``autocast``, ``after_statement``,
    ``save_state_dict``."""
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
    return cst.Module(body=[]).code_for_node(a) == cst.Module(body=[]).code_for_node(b)


def set_kwargs(call: cst.Call, edit: Edit) -> cst.Call:
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
    body = getattr(owner, "body", None)
    if not isinstance(body, list | tuple):
        raise EditError("the line is not inside a block of statements")
    return body


def statements_of(code: str) -> list[cst.BaseStatement]:
    return list(cst.parse_module(code).body)


def apply_edit(source: str, edit: Edit) -> tuple[str, Outcome]:
    """``source`` with ``edit`` made, and what happened. Never raises for an edit that cannot be placed:
    the outcome is ``refused`` with the reason and the source comes back unchanged."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return source, Outcome("refused", f"libcst cannot parse the file ({exc.message})")
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    try:
        new = _EDITORS[edit.kind](module, wrapper, edit)
    except EditError as exc:
        return source, Outcome("refused", str(exc))
    if new is None or new.code == source:
        return source, Outcome("already")
    return new.code, Outcome("applied")


def _call_kwargs(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    call = find_call(wrapper, edit.callee, edit.line)
    new = set_kwargs(call, edit)
    if same_code(call, new):
        return None
    return module.visit(Replace(call, new))


def _global_call(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    wanted = statements_of(edit.code)
    wanted_call = cst.Module(body=[]).code_for_node(wanted[0]).strip()
    head = wanted_call.split("(", 1)[0]
    imports = [
        i
        for i, s in enumerate(module.body)
        if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Import | cst.ImportFrom)
    ]
    has_torch = any(
        isinstance(s, cst.SimpleStatementLine)
        and isinstance(s.body[0], cst.Import)
        and any(dotted(n.name) == "torch" and n.asname is None for n in s.body[0].names)
        for s in module.body
    )
    if not has_torch:
        raise EditError("the file has no top-level 'import torch' to call it through")
    for s in module.body:
        text = module.code_for_node(s).strip()
        if text.startswith(head + "("):
            if text.split("#", 1)[0].strip() == wanted_call:
                return None
            raise EditError(f"the file already calls {head}() with another value; change it there")
    at = imports[-1] + 1 if imports else 0
    body: list[Any] = list(module.body)
    body[at:at] = wanted
    return module.with_changes(body=body)


def is_autocast_with(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.With) and any(
        isinstance(item.item, cst.Call) and callee_name(item.item.func) == "autocast" for item in node.items
    )


def wrap_in_autocast(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    first, owner = statement_at(wrapper, edit.line)
    last, owner_b = statement_at(wrapper, edit.end_line)
    parents = wrapper.resolve(ParentNodeProvider)
    node: cst.CSTNode | None = first
    while node is not None:  # already under an autocast block: nothing to do
        if is_autocast_with(node):
            return None
        node = parents.get(node)
    if first is last:
        raise EditError(
            "the forward and the backward are one statement, so autocast cannot wrap the forward alone"
        )
    if owner is not owner_b:
        raise EditError("the forward and the backward are not in the same block of statements")
    body = list(body_of(owner))
    i, j = body.index(first), body.index(last)
    if i > j:
        raise EditError("the backward comes before the forward in that block")
    header = cst.parse_expression(edit.code)
    # Autocast holds the forward and the loss only: a zero_grad / step / backward between them (a loop
    # that zeroes after the forward) stays outside, between two blocks when compute follows it.
    new: list[cst.BaseStatement] = []
    run: list[cst.BaseStatement] = []
    for stmt in [*body[i:j], None]:
        if stmt is not None and not _optimizer_statement(stmt):
            run.append(stmt)
            continue
        if run:
            new.append(_autocast_block(header, run))
            run = []
        if stmt is not None:
            new.append(stmt)
    body[i:j] = new
    return module.visit(Replace(owner, with_body(owner, body)))


OUTSIDE_AUTOCAST = frozenset({"zero_grad", "backward", "step"})
"""Calls that are no part of the forward and loss: torch's autocast recipe keeps them out of the block."""


def _optimizer_statement(stmt: cst.BaseStatement) -> bool:
    """True when the statement calls ``.zero_grad()``, ``.backward()`` or ``.step()`` anywhere in it."""

    class Finder(cst.CSTVisitor):
        found = False

        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Attribute) and node.func.attr.value in OUTSIDE_AUTOCAST:
                self.found = True

    finder = Finder()
    stmt.visit(finder)
    return finder.found


def _autocast_block(header: cst.BaseExpression, stmts: list[cst.BaseStatement]) -> cst.With:
    """``with HEADER:`` over ``stmts``; the first one's blank lines and comments move above the ``with``."""
    inner = [stmts[0].with_changes(leading_lines=()), *stmts[1:]]
    return cst.With(
        items=[cst.WithItem(item=header)],
        body=cst.IndentedBlock(body=inner),
        leading_lines=getattr(stmts[0], "leading_lines", ()),
    )


def with_body(owner: cst.CSTNode, body: list[cst.BaseStatement]) -> cst.CSTNode:
    return owner.with_changes(body=body)


def _after_statement(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    stmt, owner = statement_at(wrapper, edit.line)
    if isinstance(stmt, cst.BaseCompoundStatement):
        raise EditError(f"line {edit.line} opens a block, not a simple statement")
    text = module.code_for_node(stmt)
    if edit.callee and edit.callee not in text:
        raise EditError(f"line {edit.line} does not hold {edit.callee}")
    code = edit.code
    if "{var}" in code:
        code = code.replace("{var}", assigned_name(stmt))
    if "{opt}" in code:
        code = code.replace("{opt}", step_receiver(module, stmt))
    body = list(body_of(owner))
    i = body.index(stmt)
    following = body[i + 1 : i + 1 + len(statements_of(code))]
    marker = edit.marker.replace("{var}", code.split(".", 1)[0])
    if marker and any(marker in module.code_for_node(s) for s in following):
        return None
    body[i + 1 : i + 1] = statements_of(code)
    return module.visit(Replace(owner, with_body(owner, body)))


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


def _lazy(module: str, name: str) -> Any:
    """An editor kept in its own module (it imports this one, so it is looked up at call time)."""
    import importlib

    return getattr(importlib.import_module(f"torchscalpel.fix.{module}"), name)


def _doctor_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """The doctor-finding kinds, in :mod:`torchscalpel.fix.edits_doctor` (looked up when used, like
    :func:`_lazy`, because it builds on this module's helpers)."""
    editors = _lazy("edits_doctor", "EDITORS")
    return editors[edit.kind](module, wrapper, edit)


_EDITORS = {
    **dict.fromkeys(
        (
            *("set_epoch", "no_grad", "eval_mode", "detach_kept", "unscale_before_clip", "shuffle"),
            *("module_container", "register_buffer", "super_init_first", "delete_statement"),
        ),
        _doctor_edit,
    ),
    "call_kwargs": _call_kwargs,
    "call_anywhere": _call_kwargs,
    "global_call": _global_call,
    "autocast": wrap_in_autocast,
    "after_statement": _after_statement,
    "save_state_dict": lambda m, w, e: _lazy("edits_checkpoint", "save_state_dict")(m, w, e),
    "safe_load": lambda m, w, e: _lazy("edits_checkpoint", "safe_load")(m, w, e),
    **MEMORY_EDITORS,  # checkpoint_call, zero_grad_after_step, batch_accum (fix/edits_memory.py)
    "grad_scaler": lambda m, w, e: _lazy("edits_amp", "grad_scaler")(m, w, e),
    "fp32_attention_call": lambda m, w, e: _lazy("edits_amp", "fp32_attention_call")(m, w, e),
    "channels_last_inputs": lambda m, w, e: _lazy("edits_layout", "channels_last_inputs")(m, w, e),
    "sdpa": lambda m, w, e: _lazy("edits_attention", "sdpa")(m, w, e),  # unfused-attention (profile)
}
EDIT_KINDS = tuple(_EDITORS)

"""The ``channels_last_inputs`` edit: the training forward's 4-D inputs converted to channels_last.

tune's channels_last knob converts the model once and every 4-D tensor passed to it on every call.
The model's conversion is an ``after_statement`` edit at the model line
(``model = model.to(memory_format=torch.channels_last)``); the inputs' is this one: at the recorded
forward line, the call of the model (the call there of the name the model line assigns, anchor
``model``; else the one call there with as many positional arguments as the run saw the model get)
has each argument the run saw as a 4-D tensor (``edit.kwargs["inputs"]``,
positions) rewritten in place as ``x.contiguous(memory_format=torch.channels_last)``. In place, so no
line moves. A line with no such call, or with two, is refused.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from torchscalpel.fix.cst import (
    Edit,
    EditError,
    Replace,
    assigned_name,
    is_autocast_with,
    statement_at,
)

CONVERT = "contiguous(memory_format=torch.channels_last)"


def _converted(arg: cst.BaseExpression) -> bool:
    return (
        isinstance(arg, cst.Call)
        and isinstance(arg.func, cst.Attribute)
        and arg.func.attr.value == "contiguous"
        and "channels_last" in cst.Module(body=[]).code_for_node(arg)
    )


class _CallsOnLine(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, line: int, arity: int) -> None:
        self.line, self.arity = line, arity
        self.found: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        where = self.get_metadata(PositionProvider, node)
        positional = [a for a in node.args if a.keyword is None and not a.star]
        if (
            where.start.line == self.line
            and len(positional) == self.arity
            and len(positional) == len(node.args)
        ):
            self.found.append(node)


def channels_last_inputs(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """The edit (see the module doc)."""
    options = dict(edit.kwargs)
    positions = tuple(int(i) for i in options.get("inputs", ()))
    arity = int(options.get("arity", 0))
    if not positions or not arity:
        raise EditError("the run saw no 4-D input to the model's forward")
    visitor = _CallsOnLine(edit.line, arity)
    wrapper.visit(visitor)
    stmt, _ = statement_at(wrapper, edit.line)
    if not visitor.found and is_autocast_with(stmt):
        # The forward's line now opens the autocast block fix wrapped it in: the forward is its first line.
        visitor = _CallsOnLine(edit.line + 1, arity)
        wrapper.visit(visitor)
    model_line = dict(edit.anchors).get("model", 0)
    if model_line and len(visitor.found) > 1:
        try:
            name = assigned_name(statement_at(wrapper, model_line)[0])
        except EditError:
            name = ""
        visitor.found = [c for c in visitor.found if cst.Module(body=[]).code_for_node(c.func) == name]
    if len(visitor.found) != 1:
        raise EditError(
            f"line {edit.line} holds {len(visitor.found) or 'no'} call(s) with the model's {arity} positional "
            "argument(s); which one is the model is not fix's guess"
        )
    call = visitor.found[0]
    args = list(call.args)
    for i in positions:
        if i >= len(args) or _converted(args[i].value):
            continue
        value = args[i].value
        new = cst.parse_expression(f"x.{CONVERT}")
        assert isinstance(new, cst.Call) and isinstance(new.func, cst.Attribute)
        if not isinstance(value, cst.Name | cst.Attribute | cst.Subscript | cst.Call):
            value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        args[i] = args[i].with_changes(value=new.with_changes(func=new.func.with_changes(value=value)))
    new_call = call.with_changes(args=args)
    if cst.Module(body=[]).code_for_node(new_call) == cst.Module(body=[]).code_for_node(call):
        return None
    return module.visit(Replace(call, new_call))

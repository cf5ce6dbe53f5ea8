"""The mixed-precision editors: ``autocast`` (bf16), ``grad_scaler`` (fp16 with a GradScaler) and
``fp32_attention_call`` (the user's own attention call kept in float32 under autocast).

``autocast``: the statements from the training forward up to (not including) the backward, wrapped in
``with torch.autocast(...)``; a ``zero_grad`` / ``backward`` / ``step`` between them stays outside.

``grad_scaler``: fp16 autocast with a ``torch.amp.GradScaler``, at four recorded lines. The recipe (torch's AMP recipe, what tune's fp16 trial did through its inserted scaler):

- after the optimizer's construction (``edit.line``): ``scaler = torch.amp.GradScaler("cuda")``;
- the statements from the training forward (anchor ``forward``) up to the backward, wrapped in
  ``with torch.autocast(device_type=..., dtype=torch.float16):`` (the script's own autocast is kept);
- the backward (anchor ``backward``): ``loss.backward()`` becomes ``scaler.scale(loss).backward()``;
- a ``clip_grad_norm_`` / ``clip_grad_value_`` between the backward and the step, in the backward's
  block, gets ``scaler.unscale_(optimizer)`` before it (clipping must see the true gradients);
- the step (anchor ``step``): ``optimizer.step()`` becomes ``scaler.step(optimizer)`` followed by
  ``scaler.update()``.

Refused, with the reason, when a line does not hold what the recipe rewrites: the backward not a plain
``LOSS.backward()`` call statement, the step not a plain ``OPTIMIZER.step()`` one, the step on another
optimizer than the one built at the anchored line, the lines out of order, a script that already
builds its own GradScaler. The parts are made bottom to top (each adds lines only below its own anchor),
and each finds itself already made at its line: so the edit applied to its own result, with its lines
carried over by :mod:`torchscalpel.fix.linemap` (as ``scalpel fix`` does on a file it patched), finds
every part done (``already``).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from torchscalpel.fix.cst import (
    Edit,
    EditError,
    Replace,
    assigned_name,
    body_of,
    callee_name,
    find_call,
    is_autocast_with,
    statement_at,
    statements_of,
    step_receiver,
    with_body,
)


def wrap_in_autocast(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``autocast``: the statements from the forward (``edit.line``) up to the backward (``edit.end_line``)
    in ``with EDIT.CODE:``; the optimizer calls between them stay outside."""
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


SCALER = "scaler"
"""The name the inserted GradScaler is bound to."""


def node_code(node: cst.CSTNode) -> str:
    """The code a node prints as, without surrounding blanks."""
    return cst.Module(body=[]).code_for_node(node).strip()


def _small(stmt: cst.CSTNode) -> cst.BaseSmallStatement | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        return stmt.body[0]
    return None


def _backward_call(stmt: cst.CSTNode) -> cst.Call:
    small = _small(stmt)
    call = small.value if isinstance(small, cst.Expr) else None
    if (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "backward"
        and isinstance(call.func.value, cst.Name | cst.Attribute | cst.Subscript | cst.Call)
    ):
        return call
    raise EditError("the backward line is not a plain LOSS.backward() call")


def _scaled(loss: cst.BaseExpression) -> bool:
    return (
        isinstance(loss, cst.Call)
        and isinstance(loss.func, cst.Attribute)
        and loss.func.attr.value == "scale"
        and node_code(loss.func.value) == SCALER
    )


def _is_scaler_call(stmt: cst.CSTNode, method: str) -> bool:
    small = _small(stmt)
    call = small.value if isinstance(small, cst.Expr) else None
    return (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == method
        and node_code(call.func.value) == SCALER
    )


def _parse(source: str) -> tuple[cst.Module, MetadataWrapper]:
    module = cst.parse_module(source)
    return module, MetadataWrapper(module, unsafe_skip_copy=True)


def _replace_in_body(
    module: cst.Module, owner: cst.CSTNode, at: int, count: int, new: list[cst.BaseStatement]
) -> cst.Module:
    body = list(body_of(owner))
    body[at : at + count] = new
    return module.visit(Replace(owner, with_body(owner, body)))


def _scaler_part(source: str, line: int, device: str) -> tuple[str, str]:
    """After the optimizer's statement: the scaler; returns (new source, the optimizer's name)."""
    module, wrapper = _parse(source)
    stmt, owner = statement_at(wrapper, line)
    if isinstance(stmt, cst.BaseCompoundStatement):
        raise EditError(f"line {line} opens a block, not the optimizer's construction")
    name = assigned_name(stmt)
    body = list(body_of(owner))
    i = body.index(stmt)
    wanted = f'{SCALER} = torch.amp.GradScaler("{device}")'
    if i + 1 < len(body) and node_code(body[i + 1]) == wanted:
        return source, name
    return _replace_in_body(module, owner, i + 1, 0, statements_of(wanted + "\n")).code, name


def _autocast_part(source: str, forward: int, backward: int, header: str) -> tuple[str, int]:
    """The forward under fp16 autocast; returns (new source, lines it moved the backward by)."""
    module, wrapper = _parse(source)
    stmt, _ = statement_at(wrapper, forward)
    positions = wrapper.resolve(PositionProvider)
    if is_autocast_with(stmt) and positions[stmt].start.line == forward:
        return source, 1  # this edit's own with-line: the forward moved into it
    parents = wrapper.resolve(ParentNodeProvider)
    node: cst.CSTNode | None = stmt
    while node is not None:
        if is_autocast_with(node):
            return source, 0  # the script's own autocast already holds the forward
        node = parents.get(node)
    new = wrap_in_autocast(
        module, wrapper, Edit(kind="autocast", line=forward, end_line=backward, code=header)
    )
    if new is None:
        return source, 0
    return new.code, 1


def _backward_part(source: str, line: int) -> str:
    module, wrapper = _parse(source)
    stmt, _ = statement_at(wrapper, line)
    call = _backward_call(stmt)
    loss = call.func.value  # type: ignore[attr-defined]  # _backward_call checked it is an Attribute
    if _scaled(loss):
        return source
    scaled = cst.parse_expression(f"{SCALER}.scale(x)").with_changes(args=[cst.Arg(value=loss)])
    new = call.with_changes(func=call.func.with_changes(value=scaled))
    return module.visit(Replace(call, new)).code


def _unscale_part(source: str, backward: int, step: int, optimizer: str) -> tuple[str, int]:
    """``scaler.unscale_(opt)`` before a clipping statement between the backward and the step, in the
    backward's block; returns (new source, lines added or found)."""
    module, wrapper = _parse(source)
    stmt, owner = statement_at(wrapper, backward)
    positions = wrapper.resolve(PositionProvider)
    body = list(body_of(owner))
    for k in range(body.index(stmt) + 1, len(body)):
        if positions[body[k]].start.line > step:
            break
        text = node_code(body[k])
        if "clip_grad_norm_" not in text and "clip_grad_value_" not in text:
            continue
        if k > 0 and _is_scaler_call(body[k - 1], "unscale_"):
            return source, 1
        return _replace_in_body(
            module, owner, k, 0, statements_of(f"{SCALER}.unscale_({optimizer})\n")
        ).code, 1
    return source, 0


def _step_part(source: str, line: int, optimizer: str) -> str:
    module, wrapper = _parse(source)
    stmt, owner = statement_at(wrapper, line)
    body = list(body_of(owner))
    i = body.index(stmt)
    update = f"{SCALER}.update()"
    if _is_scaler_call(stmt, "step"):
        if i + 1 < len(body) and node_code(body[i + 1]) == update:
            return source
        return _replace_in_body(module, owner, i + 1, 0, statements_of(update + "\n")).code
    small = _small(stmt)
    call = small.value if isinstance(small, cst.Expr) else None
    receiver = step_receiver(module, stmt)
    if isinstance(call, cst.Call) and call.args:
        raise EditError(
            "the step line passes arguments (a closure?) to step(); GradScaler.step needs a plain call"
        )
    if receiver != optimizer:
        raise EditError(
            f"the step line steps {receiver}, not {optimizer} built at the optimizer line; which scaler goes "
            "with which optimizer is a choice"
        )
    new = statements_of(f"{SCALER}.step({optimizer})\n{update}\n")
    new[0] = new[0].with_changes(leading_lines=getattr(stmt, "leading_lines", ()))
    return _replace_in_body(module, owner, i, 1, new).code


def _own_scaler(module: cst.Module, wrapper: MetadataWrapper, optimizer_line: int, device: str) -> bool:
    """True when the script builds a GradScaler other than the one this edit puts after the optimizer."""

    class Count(cst.CSTVisitor):
        def __init__(self) -> None:
            self.calls = 0

        def visit_Call(self, node: cst.Call) -> None:
            self.calls += callee_name(node.func) == "GradScaler"

    counter = Count()
    module.visit(counter)
    stmt, owner = statement_at(wrapper, optimizer_line)
    body = list(body_of(owner))
    i = body.index(stmt)
    ours = i + 1 < len(body) and node_code(body[i + 1]) == f'{SCALER} = torch.amp.GradScaler("{device}")'
    return counter.calls > (1 if ours else 0)


def grad_scaler(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """The ``grad_scaler`` edit (see the module doc); ``edit.code`` is the autocast call, ``edit.kwargs``
    holds the scaler's ``device``."""
    anchors = dict(edit.anchors)
    opt, fwd, bwd, step = (
        edit.line,
        anchors.get("forward", 0),
        anchors.get("backward", 0),
        anchors.get("step", 0),
    )
    if not (0 < opt < fwd < bwd < step):
        raise EditError(
            "the optimizer, forward, backward and step lines are not in that order in one file "
            f"({opt}, {fwd}, {bwd}, {step})"
        )
    device = str(dict(edit.kwargs).get("device", "cuda"))
    if _own_scaler(module, wrapper, opt, device):
        raise EditError("the script already builds a GradScaler; fix does not add a second one")
    source = module.code
    optimizer = assigned_name(statement_at(wrapper, opt)[0])
    # Bottom to top, each part on the text the one below left: a part adds lines only below its own
    # anchor, so every anchor above it still means its line. A refusal in any part raises, and
    # apply_edit then returns the source as it was: no part is made alone.
    text = _step_part(source, step, optimizer)
    text, _ = _unscale_part(text, bwd, step, optimizer)
    text = _backward_part(text, bwd)
    text, _ = _autocast_part(text, fwd, bwd, edit.code)
    text, _ = _scaler_part(text, opt, device)
    return None if text == source else cst.parse_module(text)


ATTENTION = "scaled_dot_product_attention"


def _has_torch(module: cst.Module) -> bool:
    return any(
        isinstance(s, cst.SimpleStatementLine)
        and isinstance(s.body[0], cst.Import)
        and any(node_code(n.name) == "torch" and n.asname is None for n in s.body[0].names)
        for s in module.body
    )


def _under_fp32_attention(wrapper: MetadataWrapper, stmt: cst.CSTNode) -> bool:
    """True when ``stmt`` already sits in this edit's ``if torch.is_autocast_enabled(...)`` block."""
    parents = wrapper.resolve(ParentNodeProvider)
    node: cst.CSTNode | None = stmt
    while node is not None:
        if isinstance(node, cst.If) and "torch.is_autocast_enabled(" in node_code(node.test):
            return True
        node = parents.get(node)
    return False


def _float_mask(arg: cst.Arg) -> cst.Arg:
    """``attn_mask=M``: a floating mask in float32, as the knob passes it (``None`` and bool masks as they are)."""
    value = arg.value
    if isinstance(value, cst.Name) and value.value == "None":
        return arg
    if not isinstance(value, cst.Name | cst.Attribute):
        raise EditError("the attn_mask is an expression; name it first so it is computed once")
    m = node_code(value)
    cast = cst.parse_expression(
        f"{m}.float() if isinstance({m}, torch.Tensor) and {m}.is_floating_point() else {m}"
    )
    return arg.with_changes(value=cast)


def fp32_attention_call(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """tune's ``amp_fp32_attention`` at the user's own ``F.scaled_dot_product_attention(q, k, v, ...)`` call
    (``edit.line``): while autocast is on, the call runs on float32 ``q``, ``k``, ``v`` (a floating
    ``attn_mask=`` too) with autocast off, as the knob's wrapper does; otherwise the statement runs as it
    was. The user's own arguments (mask, ``is_causal``, dropout) are kept::

        if torch.is_autocast_enabled(q.device.type):  # tune's amp_fp32_attention
            with torch.autocast(device_type=q.device.type, enabled=False):
                y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    """
    stmt, _ = statement_at(wrapper, edit.line)
    if _under_fp32_attention(wrapper, stmt):
        return None
    call = find_call(wrapper, ATTENTION, edit.line)
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        raise EditError(f"line {edit.line} is not one simple statement holding the attention call")
    if not _has_torch(module):
        raise EditError("the file has no top-level 'import torch' for the autocast check")
    args = list(call.args)
    if any(a.star for a in args):
        raise EditError(
            "the attention call passes *args or **kwargs, so its query, key and value cannot be read"
        )
    qkv = args[:3]
    if len(qkv) < 3 or any(a.keyword is not None for a in qkv):
        raise EditError("the attention call does not pass query, key and value as its first three arguments")
    if not all(isinstance(a.value, cst.Name | cst.Attribute | cst.Subscript | cst.Call) for a in qkv):
        raise EditError("the attention call's query, key or value is an expression fix would need to bracket")
    if not isinstance(qkv[0].value, cst.Name | cst.Attribute):
        raise EditError("the attention call's query is computed in the call; name it first")
    rest = [
        _float_mask(a) if a.keyword is not None and a.keyword.value == "attn_mask" else a for a in args[3:]
    ]
    floats = [
        a.with_changes(value=cst.Call(func=cst.Attribute(value=a.value, attr=cst.Name("float")))) for a in qkv
    ]
    fp32 = stmt.visit(Replace(call, call.with_changes(args=[*floats, *rest])))
    assert isinstance(fp32, cst.SimpleStatementLine)  # a call replaced inside it: still the one statement
    device = f"{node_code(qkv[0].value)}.device.type"
    template = cst.parse_statement(
        f"if torch.is_autocast_enabled({device}):  # tune's amp_fp32_attention\n"
        f"    with torch.autocast(device_type={device}, enabled=False):\n"
        "        pass\n"
        "else:\n"
        "    pass\n"
    )
    assert isinstance(template, cst.If) and isinstance(template.orelse, cst.Else)
    inner = template.body.body[0]
    assert isinstance(inner, cst.With)
    plain = stmt.with_changes(leading_lines=())
    guarded = template.with_changes(
        leading_lines=stmt.leading_lines,
        body=template.body.with_changes(
            body=[
                inner.with_changes(body=inner.body.with_changes(body=[fp32.with_changes(leading_lines=())]))
            ]
        ),
        orelse=template.orelse.with_changes(body=template.orelse.body.with_changes(body=[plain])),
    )
    return module.visit(Replace(stmt, guarded))

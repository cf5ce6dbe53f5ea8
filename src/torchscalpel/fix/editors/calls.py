"""The editors of tune's plain settings: keyword arguments on a call, a ``torch.*`` setting after the
imports, statements after a recorded one.

- ``call_kwargs``: set keyword arguments on the call of ``callee`` whose span holds the line
  (optimizer ``fused=True``, DataLoader ``num_workers=2``, ``torch.load(weights_only=True)``,
  ``TrainingArguments(bf16=True)``); keys in ``drop`` are removed (``foreach`` when ``fused`` is set);
- ``call_anywhere``: the same on the one call of ``callee`` in the file (framework objects the run
  did not see being built: ``TrainingArguments``, Lightning's ``Trainer``); two calls: not patched;
- ``global_call``: a ``torch.*`` setting as a statement after the file's last top-level import;
- ``after_statement``: statements inserted after the one at the line (``model.compile()`` after the
  model is built, ``opt.zero_grad(set_to_none=True)`` after ``opt.step()``).
"""

from __future__ import annotations

from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper

from torchscalpel.fix.cst import (
    Edit,
    EditError,
    Replace,
    assigned_name,
    body_of,
    dotted,
    find_call,
    same_code,
    set_kwargs,
    statement_at,
    statements_of,
    step_receiver,
    with_body,
)


def call_kwargs(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``call_kwargs`` / ``call_anywhere``: the keyword arguments set on the call (at the line, or the one
    in the file)."""
    call = find_call(wrapper, edit.callee, edit.line)
    new = set_kwargs(call, edit)
    if same_code(call, new):
        return None
    return module.visit(Replace(call, new))


def global_call(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``global_call``: the ``torch.*`` call as a statement after the last top-level import."""
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


def after_statement(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``after_statement``: ``edit.code`` inserted after the statement at the line (``{var}``: the name it
    assigns, ``{opt}``: the optimizer it steps)."""
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

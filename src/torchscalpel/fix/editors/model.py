"""The doctor-finding edits of a model class and of single statements: ``module_container``,
``register_buffer``, ``super_init_first`` and ``delete_statement`` (what each does:
:mod:`torchscalpel.fix.editors.doctor`, which registers them).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from torchscalpel.fix.cst import (
    Edit,
    EditError,
    Replace,
    callee_name,
    dotted,
    expr_call,
    indented_code,
    index_in,
    is_docstring,
    is_name,
    node_code,
    owner_of,
    scope_of,
    statement_at,
    statements_of,
    walk_all,
    walk_nodes,
    with_statements,
)


def _self_assign(stmt: cst.CSTNode, line: int) -> tuple[cst.SimpleStatementLine, cst.Assign, str]:
    """The statement ``self.NAME = VALUE`` at the line, its assignment and ``NAME``."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Attribute)
        and is_name(small.targets[0].target.value, "self")
    ):
        return stmt, small, small.targets[0].target.attr.value  # type: ignore[return-value]
    raise EditError(f"line {line} is not one 'self.NAME = ...' assignment")


def _nn(module: cst.Module) -> str:
    """How the file names ``torch.nn``: ``nn`` (``from torch import nn``, ``import torch.nn as nn``)
    or ``torch.nn`` (``import torch``)."""
    names: set[str] = set()
    for node in walk_nodes(module):
        if isinstance(node, cst.ImportFrom) and node.module is not None and dotted(node.module) == "torch":
            if not isinstance(node.names, cst.ImportStar):
                names |= {"nn" for a in node.names if node_code(a.name) == "nn" and a.asname is None}
        elif isinstance(node, cst.Import):
            for a in node.names:
                if (
                    node_code(a.name) == "torch.nn"
                    and a.asname is not None
                    and node_code(a.asname.name) == "nn"
                ):
                    names.add("nn")
                elif node_code(a.name) == "torch" and a.asname is None:
                    names.add("torch.nn")
    if "nn" in names:
        return "nn"
    if "torch.nn" in names:
        return "torch.nn"
    raise EditError("the file imports neither torch nor torch.nn as nn at its top level")


def module_container_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``module_container``: a list or dict of modules on ``self`` as ``nn.ModuleList`` / ``nn.ModuleDict``."""
    stmt, _ = statement_at(wrapper, edit.line)
    _, assign, name = _self_assign(stmt, edit.line)
    value = assign.value
    if isinstance(value, cst.Call) and callee_name(value.func) in ("ModuleList", "ModuleDict", "Sequential"):
        return None
    if isinstance(value, cst.List | cst.ListComp | cst.Tuple | cst.GeneratorExp):
        wrapper_name = "ModuleList"
        empty = isinstance(value, cst.List | cst.Tuple) and not value.elements
    elif isinstance(value, cst.Dict | cst.DictComp) or (
        isinstance(value, cst.Call) and is_name(value.func, "dict")
    ):
        wrapper_name = "ModuleDict"
        empty = isinstance(value, cst.Dict) and not value.elements
    else:
        raise EditError(f"self.{name} at line {edit.line} is not a list, tuple or dict display")
    func = cst.parse_expression(f"{_nn(module)}.{wrapper_name}")
    new = cst.Call(func=func, args=[] if empty else [cst.Arg(value=value)])
    return module.visit(Replace(assign, assign.with_changes(value=new)))


def register_buffer_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``register_buffer``: ``self.x = <tensor>`` in ``__init__`` as ``self.register_buffer("x",
    <tensor>)``."""
    stmt, _ = statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    done = expr_call(stmt)
    if done is not None and callee_name(done.func) == "register_buffer":
        return None
    line, assign, name = _self_assign(stmt, edit.line)
    func = scope_of(stmt, parents)
    if not (isinstance(func, cst.FunctionDef) and func.name.value == "__init__"):
        raise EditError(f"self.{name} is assigned outside __init__, where register_buffer would run again")
    call = cst.parse_expression(f'self.register_buffer("{name}", _)')
    assert isinstance(call, cst.Call)
    call = call.with_changes(args=[call.args[0], call.args[1].with_changes(value=assign.value)])
    return module.visit(Replace(line, line.with_changes(body=[cst.Expr(value=call)])))


def _is_super_init(stmt: cst.CSTNode) -> bool:
    """``super().__init__(...)``, ``nn.Module.__init__(self)``, ``Base.__init__(self, ...)``."""
    call = expr_call(stmt)
    return call is not None and isinstance(call.func, cst.Attribute) and call.func.attr.value == "__init__"


def _free_names(node: cst.CSTNode) -> set[str]:
    """The names ``node`` reads (``x`` in ``f(x.y)``; not the attribute ``y``)."""
    attrs = {id(n.attr) for n in walk_nodes(node) if isinstance(n, cst.Attribute)}
    return {n.value for n in walk_nodes(node) if isinstance(n, cst.Name) and id(n) not in attrs}


def super_init_first_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``super_init_first``: ``super().__init__()`` as the first statement of the ``__init__``."""
    stmt, _ = statement_at(wrapper, edit.line)
    parents = wrapper.resolve(ParentNodeProvider)
    func = stmt if isinstance(stmt, cst.FunctionDef) else scope_of(stmt, parents)
    cls = scope_of(func, parents) if func is not None else None
    if not (
        isinstance(func, cst.FunctionDef) and func.name.value == "__init__" and isinstance(cls, cst.ClassDef)
    ):
        raise EditError(f"line {edit.line} is not in a class's __init__")
    body = indented_code(func)
    first = 1 if is_docstring(body[0]) else 0
    if first < len(body) and _is_super_init(body[first]):
        return None
    calls = [s for s in body if _is_super_init(s)]
    elsewhere = any(
        isinstance(n, cst.Attribute) and n.attr.value == "__init__"
        for s in body
        if not _is_super_init(s)
        for n in walk_nodes(s)
    )
    if len(calls) > 1 or elsewhere:
        raise EditError(f"{cls.name.value}.__init__ calls the base __init__ where fix cannot move it from")
    if calls:  # later in the body: moved up, when it reads nothing but the parameters
        call = expr_call(calls[0])
        assert call is not None
        # ``self`` itself (``nn.Module.__init__(self)``), never what was set on it before the call
        allowed = {p.name.value for p in func.params.params} - {"self"}
        reads = set().union(*(_free_names(a.value) for a in call.args if not is_name(a.value, "self")))
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
        add, rest = statements_of("super().__init__()\n")[0], body
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
    return module.visit(Replace(func, func.with_changes(body=func.body.with_changes(body=new))))


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
        call = expr_call(stmt)
        return call is not None and not call.args and node_code(call.func).endswith("empty_cache")
    return (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and node_code(small.targets[0].target).endswith("cudnn.enabled")
        and node_code(small.value) in ("False", "0")
    )


def delete_statement_edit(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``delete_statement``: the statement at the line removed (``pass`` when its block is left empty)."""
    what = edit.callee
    stmt, _ = statement_at(wrapper, edit.line)
    if not _deletable(stmt, what):
        if not any(_deletable(n, what) for n in walk_all(module)):
            return None  # deleted already (the line now holds what came after it)
        raise EditError(f"line {edit.line} is not the statement {DELETABLE[what]}")
    parents = wrapper.resolve(ParentNodeProvider)
    owner = owner_of(stmt, parents)
    body = indented_code(owner)
    i = index_in(body, stmt)
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
        rest = statements_of("pass\n")
    return module.visit(Replace(owner, with_statements(owner, rest)))

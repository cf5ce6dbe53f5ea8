"""The source edits for memory's ladder rungs (:mod:`torchscalpel.fix.memory_plan`), registered in
:data:`torchscalpel.fix.edits.EDITORS` beside tune's and doctor's kinds.

Each one follows the same rules: anchored at the line the run recorded, ``already`` (returns None)
when the code there already does it, :class:`~torchscalpel.fix.cst.EditError` (``not patched``)
when the code there is not what the run's record leads to expect. The kinds:

- ``checkpoint_call``: the one call at the recorded line of a repeated block (``x = block(x)`` in the
  model's ``forward``) becomes ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)``:
  the block's activations are recomputed in backward instead of kept. Same line, so no recorded line
  below it moves;
- ``zero_grad_after_step``: ``OPT.zero_grad(set_to_none=True)`` right after the recorded plain
  ``OPT.step()`` (or ``set_to_none=True`` on the ``OPT.zero_grad(...)`` already there): the last
  step's gradients are freed before the next forward instead of living through it;
- ``batch_accum``: a smaller batch with gradient accumulation keeping the global batch, where the
  framework owns the loop: HF ``TrainingArguments(per_device_train_batch_size=B/K,
  gradient_accumulation_steps=G*K)`` (``callee`` ``TrainingArguments``), Lightning's DataLoader
  ``batch_size=B/K`` at the recorded line plus ``Trainer(accumulate_grad_batches=G*K)`` (``callee``
  ``DataLoader``). ``kwargs`` carries ``batch`` (B, the batch the run measured) and ``k``. The batch
  in the code must be the literal B (or B/K with an accumulation that K divides: already done).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from torchscalpel.fix.cst import (
    Edit,
    EditError,
    Editor,
    Replace,
    ReplaceAll,
    body_of,
    callee_name,
    dotted,
    find_call,
    same_code,
    set_kwargs,
    statement_at,
)

CHECKPOINT = "torch.utils.checkpoint.checkpoint"
"""How the wrapped call is spelled: through the file's own ``import torch`` (``torch.utils.checkpoint``
is loaded by ``import torch``), so that no import line is added and no recorded line below moves."""


class _CallsOnLine(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, line: int) -> None:
        self.line = line
        self.found: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        if self.get_metadata(PositionProvider, node).start.line == self.line:
            self.found.append(node)


def _imports_torch(module: cst.Module) -> bool:
    return any(
        isinstance(s, cst.SimpleStatementLine)
        and isinstance(s.body[0], cst.Import)
        and any(dotted(n.name) == "torch" and n.asname is None for n in s.body[0].names)
        for s in module.body
    )


def _checkpoint_call(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    visitor = _CallsOnLine(edit.line)
    wrapper.visit(visitor)
    calls = visitor.found
    if any(callee_name(c.func) == "checkpoint" for c in calls):
        return None  # the block's call is already checkpointed (by this fix or by hand)
    if len(calls) != 1:
        raise EditError(
            f"line {edit.line} holds {len(calls) or 'no'} call{'s' if len(calls) != 1 else ''}, not the one call "
            f"of a {edit.callee} block; which one to checkpoint is not fix's guess"
        )
    call = calls[0]
    if not isinstance(call.func, cst.Name | cst.Attribute | cst.Subscript):
        raise EditError(f"line {edit.line} does not call a module by name (block(x), self.block(x))")
    if any(a.keyword is not None and a.keyword.value == "use_reentrant" for a in call.args):
        raise EditError(f"the call at line {edit.line} already passes use_reentrant")
    if not _imports_torch(module):
        raise EditError("the file has no top-level 'import torch' to call torch.utils.checkpoint through")
    args = list(call.args)
    if args and not isinstance(args[-1].comma, cst.Comma):
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    first = cst.Arg(value=call.func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    flag = cst.Arg(
        keyword=cst.Name("use_reentrant"),
        value=cst.Name("False"),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )
    new = cst.Call(func=cst.parse_expression(CHECKPOINT), args=[first, *args, flag])
    return module.visit(Replace(call, new))


def _plain_call(stmt: cst.CSTNode, method: str) -> cst.Call | None:
    """The call of ``stmt`` when it is the one expression ``X.method(...)`` (None otherwise)."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    call = small.value if isinstance(small, cst.Expr) else None
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == method:
        return call
    return None


def _zero_grad_after_step(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    stmt, owner = statement_at(wrapper, edit.line)
    step = _plain_call(stmt, "step")
    if step is None or step.args or not isinstance(step.func, cst.Attribute):
        # ``scaler.step(opt)`` / ``opt.step(closure)``: the optimizer is not the call's receiver
        raise EditError(f"line {edit.line} is not a plain OPTIMIZER.step() call")
    receiver = module.code_for_node(step.func.value)
    body = list(body_of(owner))
    i = body.index(stmt)
    after = body[i + 1] if i + 1 < len(body) else None
    zero = _plain_call(after, "zero_grad") if after is not None else None
    if zero is not None and isinstance(zero.func, cst.Attribute):
        if module.code_for_node(zero.func.value) != receiver:
            raise EditError(f"the statement after {receiver}.step() zeroes another object's gradients")
        new = set_kwargs(zero, Edit(kind="call_kwargs", callee="zero_grad", kwargs=(("set_to_none", True),)))
        return None if same_code(zero, new) else module.visit(Replace(zero, new))
    body[i + 1 : i + 1] = list(cst.parse_module(f"{receiver}.zero_grad(set_to_none=True)\n").body)
    return module.visit(Replace(owner, owner.with_changes(body=body)))


def _int_arg(call: cst.Call, key: str, position: int | None = None) -> tuple[int, cst.Arg | None]:
    """The literal int passed as ``key`` (or at ``position``): ``(value, arg)``; ``(0, None)`` when absent."""

    arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == key), None)
    if arg is None and position is not None:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        arg = positional[position] if len(positional) > position else None
    if arg is None:
        if any(a.star == "**" for a in call.args):
            raise EditError(f"the {callee(call)} call passes **kwargs, which may set {key}")
        return 0, None
    if not isinstance(arg.value, cst.Integer):
        raise EditError(
            f"{key} is not a number written in the {callee(call)} call, so its value cannot be read"
        )
    return int(arg.value.evaluated_value), arg


def callee(call: cst.Call) -> str:
    """The called name, for messages."""

    return callee_name(call.func) or "called"


def _with_int(call: cst.Call, key: str, value: int, arg: cst.Arg | None) -> cst.Call:
    if arg is not None:  # in place (positional kept positional)
        return call.with_changes(
            args=[a.with_changes(value=cst.Integer(str(value))) if a is arg else a for a in call.args]
        )
    return set_kwargs(call, Edit(kind="call_kwargs", callee=callee(call), kwargs=((key, value),)))


def _scaled(batch: int, k: int, size: int, accum: int, what: str) -> tuple[int, int] | None:
    """The new (batch, accumulation); None when already split so; EditError when the code's batch is another."""

    if size == batch:
        return batch // k, max(1, accum) * k
    if size == batch // k and accum and accum % k == 0:
        return None
    raise EditError(
        f"{what} is {size or 'not set'} in the code, not the batch of {batch} the run measured"
        if size
        else f"{what} is not set in the code, so the batch the run measured ({batch}) is not written there"
    )


def _batch_accum(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    params = dict(edit.kwargs)
    batch, k = int(params["batch"]), int(params["k"])
    if k < 2 or batch % k:
        raise EditError(f"{k} micro-batches do not split the batch of {batch} evenly")
    if edit.callee == "TrainingArguments":
        args = find_call(wrapper, "TrainingArguments", 0)
        size, size_arg = _int_arg(args, "per_device_train_batch_size")
        accum, accum_arg = _int_arg(args, "gradient_accumulation_steps")
        scaled = _scaled(batch, k, size, accum, "per_device_train_batch_size")
        if scaled is None:
            return None
        new = _with_int(args, "per_device_train_batch_size", scaled[0], size_arg)
        new = _with_int(new, "gradient_accumulation_steps", scaled[1], accum_arg)
        return module.visit(Replace(args, new))
    if edit.callee == "DataLoader":  # Lightning: the loader's batch here, the accumulation in the Trainer
        loader = find_call(wrapper, "DataLoader", edit.line)
        trainer = find_call(wrapper, "Trainer", 0)
        size, size_arg = _int_arg(loader, "batch_size", position=1)
        accum, accum_arg = _int_arg(trainer, "accumulate_grad_batches")
        scaled = _scaled(batch, k, size, accum, "the DataLoader's batch_size")
        if scaled is None:
            return None
        loader_new = _with_int(loader, "batch_size", scaled[0], size_arg)
        trainer_new = _with_int(trainer, "accumulate_grad_batches", scaled[1], accum_arg)
        return module.visit(ReplaceAll({loader: loader_new, trainer: trainer_new}))
    raise EditError(
        f"fix places micro-batches in TrainingArguments or a Lightning DataLoader, not {edit.callee}"
    )


EDITORS: dict[str, Editor] = {
    "checkpoint_call": _checkpoint_call,
    "zero_grad_after_step": _zero_grad_after_step,
    "batch_accum": _batch_accum,
}
"""The kinds this module adds to :data:`torchscalpel.fix.edits.EDITORS`."""

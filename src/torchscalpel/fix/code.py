"""Code ``scalpel fix`` writes, built as libcst nodes from typed values, never by pasting a string.

Every value that reaches the user's code from a record (a thread count, a precision, a compile mode,
the device a forward ran on) has been checked against its type and allowed set
(:mod:`torchscalpel.fix.record_values`) and becomes a node of its own type here: an ``int`` a
``cst.Integer``, a ``str`` a ``cst.SimpleString`` (quoted and escaped), a ``bool`` ``True``/``False``.
A value of any other type raises ``TypeError``: there is no path by which record text becomes code.
Names (``torch.set_num_threads``, ``torch.bfloat16``) come from fix's own code, never from a record.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import libcst as cst

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def name(dotted: str) -> cst.Name | cst.Attribute:
    """``torch.bfloat16`` as an attribute chain (a name fix's own code spells, checked all the same)."""
    if not _DOTTED.fullmatch(dotted):
        raise ValueError(f"{dotted!r} is not a dotted name")
    head, *rest = dotted.split(".")
    node: cst.Name | cst.Attribute = cst.Name(head)
    for part in rest:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


class Name(str):
    """A value that :func:`value` writes as a name (``torch.bfloat16``), not as a string."""


def value(v: Any) -> cst.BaseExpression:
    """``v`` as a literal node: bool, None, int, finite float, str (double-quoted, escaped), a tuple of
    those, or a :class:`Name`; anything else raises ``TypeError``."""
    if isinstance(v, Name):
        return name(str(v))
    if v is None or isinstance(v, bool):
        return cst.Name(repr(v))
    if isinstance(v, int):
        node: cst.BaseExpression = cst.Integer(str(abs(v)))
        return cst.UnaryOperation(operator=cst.Minus(), expression=node) if v < 0 else node
    if isinstance(v, float) and math.isfinite(v):
        node = cst.Float(repr(abs(v)))
        return cst.UnaryOperation(operator=cst.Minus(), expression=node) if v < 0 else node
    if isinstance(v, str):
        # json's escapes (\", \\, \n, \uXXXX) are Python's too: the text stays one string literal
        return cst.SimpleString(json.dumps(v))
    if isinstance(v, tuple):
        elements = [cst.Element(value(x)) for x in v]
        return cst.Tuple(
            elements=elements if len(elements) != 1 else [elements[0].with_changes(comma=cst.Comma())]
        )
    raise TypeError(f"fix writes no {type(v).__name__} into code")


def _kwarg(key: str, v: Any) -> cst.Arg:
    if not key.isidentifier():
        raise ValueError(f"{key!r} is not a keyword name")
    no_space = cst.SimpleWhitespace("")
    return cst.Arg(
        keyword=cst.Name(key),
        value=value(v),
        equal=cst.AssignEqual(whitespace_before=no_space, whitespace_after=no_space),
    )


def call(func: str, *args: Any, **kwargs: Any) -> cst.Call:
    """``func(*args, **kwargs)`` with every argument a :func:`value` node."""
    items = [cst.Arg(value(a)) for a in args] + [_kwarg(k, v) for k, v in kwargs.items()]
    with_commas = [
        a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for a in items[:-1]
    ]
    return cst.Call(func=name(func), args=[*with_commas, *items[-1:]])


def text(node: cst.CSTNode) -> str:
    """The code of ``node``."""
    return cst.Module(body=[]).code_for_node(node)


def statement(node: cst.BaseExpression) -> str:
    """``node`` as one statement line (with its newline), for the edits that insert statements."""
    return text(cst.SimpleStatementLine(body=[cst.Expr(node)]))


def cache_off_statement(var: str) -> str:
    """``VAR.config.use_cache = False`` as a statement line, with its reason as a comment.

    Tune's compile candidate turns a transformers model's key/value cache off in training (``compile.use_cache =
    false`` in scalpel.toml): the cache a training forward builds is never read, and under compile its guards
    recompiled the model during timed steps. What tune measured is compile *with* that setting, so fix inserts it
    beside the compile call, on ``var``, the name the model's own line assigns."""
    return f"{var}.config.use_cache = False  # no key/value cache in training (what tune measured)\n"

"""The ``sdpa`` editor (``unfused-attention`` as an edit, planned by :mod:`torchscalpel.fix.profile_plan`):
the statements from the scores to the weighted sum become one ``F.scaled_dot_product_attention`` call,
in the user's own attention code.

The profile run's finding names the line of ``q @ k.transpose(-2, -1)`` (:mod:`torchscalpel.trace.patterns`).
The editor reads the code there again (:func:`torchscalpel.trace.attention_code.read_attention`: the
file is the one the run measured, its hash checked by :mod:`torchscalpel.fix.stage`), so the call it
writes follows the mask the code applies: ``is_causal=True`` only for a mask that is, with certainty,
causal (nanoGPT's ``self.bias`` tril buffer, minGPT's ``self.mask``), ``attn_mask=`` for a padding or
additive mask (boolean masks negated: in SDPA True = take part), neither for bidirectional attention
(ViT, BERT without a mask), ``dropout_p=`` from the dropout on the weights, ``scale=`` unless the code
scales by 1/sqrt(d). Code it cannot read with certainty is ``not patched`` with the reason, never
guessed causal. The output statement keeps its own layout and comments (``(attn @ v).transpose(1, 2)``
keeps its ``.transpose(1, 2)``); the statements before it go.

``--verify`` then runs the original and the patched function on the same inputs
(:mod:`torchscalpel.fix.verify_attention`).
"""

from __future__ import annotations

import ast

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from torchscalpel.fix.cst import Edit, EditError, Replace, body_of, statement_at
from torchscalpel.trace.attention_code import SDPA, Unread, read_attention


def _char_col(lines: list[str], line: int, byte_col: int) -> int:
    """ast counts columns in UTF-8 bytes; libcst in characters."""
    return len(lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def _cst_node(wrapper: MetadataWrapper, lines: list[str], node: ast.expr) -> cst.CSTNode:
    """The libcst expression spanning ``node`` (its smallest matmul-shaped one: parentheses are part of a
    libcst node and not of an ast one)."""
    start = (node.lineno, _char_col(lines, node.lineno, node.col_offset))
    end_line = node.end_lineno or node.lineno
    end = (end_line, _char_col(lines, end_line, node.end_col_offset or 0))
    best: tuple[tuple[int, int], cst.CSTNode] | None = None
    for candidate, where in wrapper.resolve(PositionProvider).items():
        if not isinstance(candidate, cst.BinaryOperation | cst.Call):
            continue
        s, e = (where.start.line, where.start.column), (where.end.line, where.end.column)
        if s <= start and e >= end:
            size = (e[0] - s[0], e[1] - s[1])
            if best is None or size < best[0]:
                best = (size, candidate)
    if best is None:
        raise EditError(f"fix cannot find the weighted sum of line {node.lineno} in the file")
    return best[1]


LINE_WIDTH = 100
"""Beyond this many columns (indentation included) the fused call is written one argument a line."""


def _one_argument_a_line(call: cst.Call) -> cst.Call:
    """``call`` with each argument on its own line, one level deeper than the statement, a trailing comma,
    and the closing parenthesis on a line of its own (as black and ruff lay out a call too long for a line)."""

    def brk(extra: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(extra))

    args = [a.with_changes(comma=cst.Comma(whitespace_after=brk("    "))) for a in call.args]
    args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=brk("")))
    return call.with_changes(args=args, whitespace_before_args=brk("    "))


def sdpa(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """The ``sdpa`` edit (see the module doc); None when the line already calls the fused attention."""
    source = module.code
    try:
        code = read_attention(source, edit.line)
    except Unread as exc:
        try:
            stmt, _ = statement_at(wrapper, edit.line)
        except EditError:
            stmt = None
        if stmt is not None and SDPA in module.code_for_node(stmt):
            return None  # the scores' line became the fused call: done
        raise EditError(
            f"fix cannot read this attention with certainty ({exc}), so it writes no is_causal or mask"
        ) from None
    first, owner = statement_at(wrapper, code.first)
    last, owner_last = statement_at(wrapper, code.statement.lineno)
    if owner is not owner_last:
        raise EditError("the scores and the weighted sum are not in the same block of statements")
    body = list(body_of(owner))
    i, j = body.index(first), body.index(last)
    matmul = _cst_node(wrapper, source.splitlines(), code.output)
    call = cst.parse_expression(ast.unparse(code.call()))
    fused = last.visit(Replace(matmul, call))
    if not isinstance(fused, cst.BaseStatement):
        raise EditError(f"fix cannot rewrite line {code.statement.lineno}")
    text = source.splitlines()[code.statement.lineno - 1]
    indent = len(text) - len(text.lstrip())
    if (
        isinstance(call, cst.Call)
        and indent + len(module.code_for_node(fused).strip().splitlines()[0]) > LINE_WIDTH
    ):
        wrapped = last.visit(Replace(matmul, _one_argument_a_line(call)))
        fused = wrapped if isinstance(wrapped, cst.BaseStatement) else fused
    fused = fused.with_changes(leading_lines=getattr(first, "leading_lines", ()))
    body[i : j + 1] = [fused]
    return module.visit(Replace(owner, owner.with_changes(body=body)))

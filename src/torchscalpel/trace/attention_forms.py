"""The code shapes hand-written attention is made of, read with :mod:`ast` (no torch): the matmuls and
the transposed key, the constants, how a mask condition reads (which tensor, masked where it is zero or
not) and its negation (SDPA's boolean masks are True where a position takes part), the fills as good as
-inf, the square ``torch.ones`` / ``torch.full(-inf)`` a triangle is built from, the top-left slice, the
default scale 1/sqrt(d). :mod:`torchscalpel.trace.attention_code` follows the statements with them.
"""

from __future__ import annotations

import ast

MATMUL_FUNCS = frozenset({"torch.matmul", "torch.bmm", "matmul", "bmm"})


LARGE_NEGATIVE = -1e4
"""A fill value at or below this is as good as -inf after the softmax (exp(-1e4) is 0 in every float type)."""


def dotted(node: ast.AST) -> str:
    """``torch.nn.functional.softmax`` for an attribute chain of names ("" otherwise)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr}" if head else ""
    return ""


def const(node: ast.AST) -> object:
    """The value of a number written as a literal (``-1``, ``2``), else None."""
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = const(node.operand)
        return -inner if isinstance(inner, int | float) else None
    return None


def matmul_operands(node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    """(left, right) of ``a @ b``, ``torch.matmul(a, b)``, ``a.matmul(b)``; None for anything else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return node.left, node.right
    if isinstance(node, ast.Call) and not node.keywords:
        if dotted(node.func) in MATMUL_FUNCS and len(node.args) == 2:
            return node.args[0], node.args[1]
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("matmul", "bmm")
            and len(node.args) == 1
        ):
            return node.func.value, node.args[0]
    return None


def transposed(node: ast.AST) -> ast.expr | None:
    """``k`` for ``k.transpose(-2, -1)``, ``k.transpose(-1, -2)``, ``torch.transpose(k, -2, -1)``, ``k.mT``."""
    if isinstance(node, ast.Attribute) and node.attr == "mT":
        return node.value
    if isinstance(node, ast.Call) and not node.keywords:
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("transpose", "swapaxes")
            and len(node.args) == 2
        ):
            tensor, dims = node.func.value, node.args
        elif dotted(node.func) == "torch.transpose" and len(node.args) == 3:
            tensor, dims = node.args[0], node.args[1:]
        else:
            return None
        if {const(d) for d in dims} == {-1, -2}:
            return tensor
    return None


def mutated(root: ast.AST, text: str) -> bool:
    """True when the tensor written ``text`` (``self.bias``, ``mask``) is changed in place anywhere under
    ``root``: an item assigned (``mask[0] = 1``), an in-place method (``mask.fill_diagonal_(0)``), its ``.data``."""
    for node in ast.walk(root):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and ast.unparse(node.value) == text
        ):
            return True
        in_place = isinstance(node, ast.Attribute) and (
            node.attr == "data" or (node.attr.endswith("_") and not node.attr.startswith("_"))
        )
        if in_place and ast.unparse(getattr(node, "value", node)) == text:
            return True
    return False


def top_left(index: ast.AST) -> bool:
    """True for ``[:, :, :T, :T]`` / ``[:T, :T]`` / ``[..., :T, :T]``: the top-left corner of the last two dims."""
    parts = list(index.elts) if isinstance(index, ast.Tuple) else [index]
    if len(parts) < 2:
        return False

    def full(p: ast.AST) -> bool:
        return (isinstance(p, ast.Slice) and p.lower is None and p.upper is None and p.step is None) or (
            isinstance(p, ast.Constant) and p.value is Ellipsis
        )

    def corner(p: ast.AST) -> bool:
        return isinstance(p, ast.Slice) and p.step is None and (p.lower is None or const(p.lower) == 0)

    return all(full(p) for p in parts[:-2]) and all(corner(p) for p in parts[-2:])


def only_new_axes(index: ast.AST) -> bool:
    """True for an index that only adds axes or keeps them whole (``[None, None]``, ``[:, None]``)."""
    parts = list(index.elts) if isinstance(index, ast.Tuple) else [index]
    return all(
        (isinstance(p, ast.Constant) and p.value in (None, Ellipsis))
        or (isinstance(p, ast.Slice) and p.lower is None and p.upper is None and p.step is None)
        for p in parts
    )


def square(node: ast.AST | None) -> str:
    """``ones`` for ``torch.ones(n, n)`` (``(n, n)``, leading 1s allowed), ``-inf`` for
    ``torch.full((n, n), float('-inf'))``, "" otherwise."""
    if not isinstance(node, ast.Call):
        return ""
    name = dotted(node.func)
    if name == "torch.ones":
        dims = node.args
        fill: ast.AST | None = None
    elif name == "torch.full" and len(node.args) == 2:
        dims, fill = [node.args[0]], node.args[1]
    else:
        return ""
    if len(dims) == 1 and isinstance(dims[0], ast.Tuple | ast.List):
        dims = dims[0].elts
    if len(dims) < 2 or any(const(d) != 1 for d in dims[:-2]):
        return ""
    if ast.dump(dims[-1]) != ast.dump(dims[-2]):
        return ""
    if fill is None:
        return "ones"
    return "-inf" if is_minus_inf(fill) else ""


def is_minus_inf(node: ast.AST) -> bool:
    """True for ``float("-inf")``, ``-float("inf")``, ``-math.inf``, ``-torch.inf`` and the like."""
    text = ast.unparse(node).replace('"', "'").replace(" ", "").lower()
    return text in (
        "float('-inf')",
        "-float('inf')",
        "-math.inf",
        "-torch.inf",
        "-np.inf",
        "-numpy.inf",
        "float('-infinity')",
    )


def very_negative(node: ast.AST) -> bool:
    """-inf, ``torch.finfo(...).min`` or a literal at or below :data:`LARGE_NEGATIVE`."""
    value = const(node)
    if isinstance(value, int | float):
        return value <= LARGE_NEGATIVE
    if is_minus_inf(node):
        return True
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "min"
        and isinstance(node.value, ast.Call)
        and dotted(node.value.func) == "torch.finfo"
    )


def polarity(cond: ast.expr) -> tuple[ast.expr | None, bool]:
    """(the tensor ``cond`` is read from, True when the masked positions are where it is zero)."""
    if isinstance(cond, ast.Compare) and len(cond.ops) == 1:
        right = cond.comparators[0]
        value = (
            const(right)
            if not (isinstance(right, ast.Constant) and isinstance(right.value, bool))
            else int(right.value)
        )
        if value == 0 and isinstance(cond.ops[0], ast.Eq):
            return cond.left, True
        if (value == 0 and isinstance(cond.ops[0], ast.NotEq | ast.Gt)) or (
            value == 1 and isinstance(cond.ops[0], ast.Eq)
        ):
            return cond.left, False
        return None, False
    if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Invert | ast.Not):
        return cond.operand, True
    if isinstance(cond, ast.Call) and isinstance(cond.func, ast.Attribute) and not cond.args:
        if cond.func.attr == "logical_not":
            return cond.func.value, True
        if cond.func.attr == "bool":
            return cond.func.value, False
    if isinstance(cond, ast.Call) and dotted(cond.func) == "torch.logical_not" and len(cond.args) == 1:
        return cond.args[0], True
    if isinstance(cond, ast.Name | ast.Attribute | ast.Subscript):
        return cond, False
    return None, False


def negation(cond: ast.expr) -> ast.expr:
    """True where ``cond`` is False: ``a != b`` for ``a == b``, ``x`` for ``~x``, else ``~(cond)``."""
    if isinstance(cond, ast.Compare) and len(cond.ops) == 1 and isinstance(cond.ops[0], ast.Eq | ast.NotEq):
        op: ast.cmpop = ast.NotEq() if isinstance(cond.ops[0], ast.Eq) else ast.Eq()
        return ast.Compare(left=cond.left, ops=[op], comparators=cond.comparators)
    if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Invert):
        return cond.operand
    if (
        isinstance(cond, ast.Call)
        and isinstance(cond.func, ast.Attribute)
        and cond.func.attr == "logical_not"
        and not cond.args
    ):
        return cond.func.value
    return ast.UnaryOp(op=ast.Invert(), operand=cond)


def is_not_none(test: ast.expr, mask: ast.expr) -> bool:
    """True when ``test`` is ``MASK is not None`` for this very ``mask``."""
    return (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.IsNot)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
        and ast.dump(test.left) == ast.dump(mask)
    )


def sqrt_of(node: ast.expr) -> ast.expr | None:
    """``x`` for ``math.sqrt(x)`` (``np.sqrt``, ``x ** 0.5``), else None."""
    if (
        isinstance(node, ast.Call)
        and dotted(node.func) in ("math.sqrt", "np.sqrt", "numpy.sqrt", "sqrt")
        and len(node.args) == 1
    ):
        return node.args[0]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and const(node.right) == 0.5:
        return node.left
    return None


def last_dim_of(node: ast.expr, tensors: set[str]) -> bool:
    """True for ``x.size(-1)``, ``x.shape[-1]``, ``x.size()[-1]`` of one of ``tensors`` (q's or k's code)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size":
        return len(node.args) == 1 and const(node.args[0]) == -1 and ast.unparse(node.func.value) in tensors
    if isinstance(node, ast.Subscript) and const(node.slice) == -1:
        inner = node.value
        if isinstance(inner, ast.Attribute) and inner.attr == "shape":
            return ast.unparse(inner.value) in tensors
        if (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr == "size"
            and not inner.args
        ):
            return ast.unparse(inner.func.value) in tensors
    return False

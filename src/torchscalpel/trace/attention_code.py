"""Hand-written attention read from its source: what ``F.scaled_dot_product_attention`` call computes the same.

The ``unfused-attention`` pattern (:mod:`torchscalpel.trace.patterns`) finds ``matmul -> softmax ->
matmul`` in the op-line pass; this module reads the code at that line (stdlib :mod:`ast`, no torch) to
say which fused call replaces it: the mask the code applies, its scale, the dropout on the weights.
``profile`` prints the call as the finding's fix, and ``scalpel fix`` (:mod:`torchscalpel.fix.editors.attention`)
writes it in place of the statements from the scores to the weighted sum.

The statements are followed one value at a time, from ``q @ k.transpose(-2, -1)`` (the finding's line)
to ``weights @ v``: every statement in between must change that value only, in a way this module knows:

- a scale (``* c``, ``/ c``, ``*=``, ``/=``): ``scale=`` unless it is ``1/sqrt(d)`` of q's or k's last
  dimension (SDPA's default); no scale at all is ``scale=1.0``;
- ``masked_fill(cond, -inf)`` (``masked_fill_``): a boolean mask; SDPA's boolean ``attn_mask`` means
  True = take part, so the mask passed is the negation of ``cond`` (``bias == 0`` becomes ``bias != 0``).
  It is ``is_causal=True`` only when ``cond`` is, with certainty, the upper triangle: a ``torch.tril`` of a
  square ``torch.ones`` (a registered buffer of the class, or a local) compared ``== 0`` / negated, or a
  ``torch.triu(..., diagonal=1)`` taken as is, sliced from its top-left corner;
- ``+ mask``: an additive (float) mask, passed as ``attn_mask=`` (SDPA adds a float mask to the scaled
  scores); ``is_causal=True`` only for ``torch.triu(torch.full(..., -inf), diagonal=1)`` or
  ``nn.Transformer.generate_square_subsequent_mask``;
- either under ``if TEST:`` (``if attention_mask is not None``): ``attn_mask=MASK if TEST else None``
  (``attn_mask=attention_mask`` when the test is that mask being None), never ``is_causal``;
- ``softmax(dim=-1)``, then dropout: an ``nn.Dropout`` attribute (``dropout_p=self.drop.p if self.training
  else 0.0``) or ``F.dropout(w, p, training)`` (``dropout_p=p if training else 0.0``).

Anything else (a second mask, ``head_mask`` multiplying the weights, weights read again after the
weighted sum, a scale applied after an additive mask) raises :class:`Unread` with the line and the
reason: the fix then says it could not read the mask, and gives no ``is_causal`` at all.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from torchscalpel.trace.attention_forms import (
    const,
    dotted,
    is_not_none,
    last_dim_of,
    matmul_operands,
    mutated,
    negation,
    only_new_axes,
    polarity,
    sqrt_of,
    square,
    top_left,
    transposed,
    very_negative,
)

SDPA = "scaled_dot_product_attention"
_SOFTMAX_FUNCS = frozenset(
    {"F.softmax", "torch.softmax", "nn.functional.softmax", "torch.nn.functional.softmax", "softmax"}
)
_DROPOUT_FUNCS = frozenset(
    {"F.dropout", "nn.functional.dropout", "torch.nn.functional.dropout", "torch.dropout"}
)
_FUNCTIONAL = ("F", "nn.functional", "torch.nn.functional")
_RESHAPES = frozenset(
    {
        "view",
        "reshape",
        "unsqueeze",
        "bool",
        "to",
        "float",
        "int",
        "long",
        "byte",
        "type",
        "contiguous",
        "cuda",
        "expand",
    }
)
"""Calls on a mask's definition that keep which positions are zero (``.view(1, 1, n, n)``, ``.bool()``)."""


class Unread(Exception):
    """The code at the line is not attention this module can read with certainty; the message says why."""


@dataclass(frozen=True, slots=True)
class Mask:
    """The mask the code applies to the scores."""

    kind: str
    """``causal`` (``is_causal=True``), ``boolean`` (``node`` is True where a position takes part) or
    ``additive`` (``node`` is added to the scores)."""
    node: ast.expr | None
    """The ``attn_mask=`` expression (None for ``causal``)."""
    line: int
    how: str
    """What the code does, for people: ``self.bias (torch.tril of torch.ones, line 21) == 0 filled with -inf``."""


@dataclass(frozen=True, slots=True)
class AttentionCode:
    """One hand-written attention, read from its code: the fused call that computes the same."""

    function: str
    """Qualified name of the function holding it (``CausalSelfAttention.forward``)."""
    def_line: int
    """The function's first line (its first decorator's, as ``co_firstlineno`` counts it)."""
    first: int
    """Line of the statement computing the scores."""
    last: int
    """Last line of the statement computing the weighted sum."""
    q: ast.expr
    k: ast.expr
    v: ast.expr
    mask: Mask | None
    scale: ast.expr | None
    """``scale=``; None: the code scales by 1/sqrt(d) of q's or k's last dimension, SDPA's default."""
    dropout: ast.expr | None
    """``dropout_p=``; None: no dropout on the weights."""
    functional: str
    """How the file names ``torch.nn.functional`` (``F``)."""
    output: ast.expr
    """The ``weights @ v`` node the call replaces."""
    statement: ast.stmt
    """The statement holding ``output``."""
    names: tuple[str, ...]
    """The variables that held the scores and weights (gone after the edit)."""

    def call(self) -> ast.Call:
        """The ``F.scaled_dot_product_attention(q, k, v, ...)`` call."""
        keywords = []
        if self.mask is not None and self.mask.node is not None:
            keywords.append(ast.keyword(arg="attn_mask", value=self.mask.node))
        if self.dropout is not None:
            keywords.append(ast.keyword(arg="dropout_p", value=self.dropout))
        if self.mask is not None and self.mask.kind == "causal":
            keywords.append(ast.keyword(arg="is_causal", value=ast.Constant(True)))
        if self.scale is not None:
            keywords.append(ast.keyword(arg="scale", value=self.scale))
        func: ast.expr = ast.Name(id=self.functional.split(".")[0], ctx=ast.Load())
        for part in [*self.functional.split(".")[1:], SDPA]:
            func = ast.Attribute(value=func, attr=part, ctx=ast.Load())
        return ast.Call(func=func, args=[self.q, self.k, self.v], keywords=keywords)

    def statement_text(self) -> str:
        """The statement that replaces the ones from the scores to the weighted sum, as code."""
        memo: dict[int, object] = {}
        stmt = copy.deepcopy(self.statement, memo)
        target = memo[id(self.output)]
        return ast.unparse(_Swap(target, self.call()).visit(stmt))

    def mask_text(self) -> str:
        """The mask, in words, with what the fused call does with it."""
        if self.mask is None:
            return "no mask: the attention is bidirectional (no is_causal, no attn_mask)"
        if self.mask.kind == "causal":
            return f"causal mask: {self.mask.how}: is_causal=True"
        if self.mask.kind == "boolean":
            return f"boolean mask: {self.mask.how}: attn_mask is its negation (True = take part)"
        return f"additive mask: {self.mask.how}: attn_mask= adds it to the scores, as the code does"


class _Swap(ast.NodeTransformer):
    def __init__(self, old: object, new: ast.AST) -> None:
        self.old, self.new = old, new

    def visit(self, node: ast.AST) -> ast.AST:
        if node is self.old:
            return self.new
        return super().visit(node)


def _score_matmul(node: ast.AST) -> tuple[ast.expr, ast.expr, ast.expr] | None:
    """(the matmul node, q, k) when ``node`` is ``q @ k.transpose(-2, -1)``."""
    ops = matmul_operands(node)
    if ops is None:
        return None
    k = transposed(ops[1])
    return (node, ops[0], k) if k is not None and isinstance(node, ast.expr) else None


def _parents(root: ast.AST) -> dict[int, ast.AST]:
    return {id(child): parent for parent in ast.walk(root) for child in ast.iter_child_nodes(parent)}


def _loads(node: ast.AST, names: set[str] | frozenset[str]) -> list[ast.Name]:
    return [
        n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)
    ]


def _blocks(fn: ast.AST) -> list[list[ast.stmt]]:
    """Every statement list under ``fn`` (bodies, else branches, handlers), nested functions left out."""
    out: list[list[ast.stmt]] = []
    todo: list[ast.AST] = [fn]
    while todo:
        node = todo.pop()
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                out.append(stmts)
                todo.extend(
                    s
                    for s in stmts
                    if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                )
        todo.extend(getattr(node, "handlers", []) or [])
        todo.extend(getattr(node, "cases", []) or [])
    return out


def _enclosing(tree: ast.Module, line: int) -> tuple[list[ast.AST], ast.FunctionDef | ast.AsyncFunctionDef]:
    """The chain of classes and functions down to the innermost function holding ``line``."""
    chain: list[ast.AST] = []
    body: list[ast.stmt] = tree.body
    fn: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    while True:
        inner = next(
            (
                s
                for s in body
                if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and s.lineno <= line <= (s.end_lineno or s.lineno)
            ),
            None,
        )
        if inner is None:
            # a def nested in an if / with / for block of the one above
            inner = next(
                (
                    n
                    for s in body
                    if s.lineno <= line <= (s.end_lineno or s.lineno)
                    for n in ast.walk(s)
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                    and n is not s
                    and n.lineno <= line <= (n.end_lineno or n.lineno)
                ),
                None,
            )
        if inner is None:
            break
        chain.append(inner)
        if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef):
            fn = inner
        body = inner.body
    if fn is None:
        raise Unread(f"line {line} is not inside a function")
    return chain[: chain.index(fn) + 1], fn


@dataclass(slots=True)
class _Op:
    kind: str
    """``scale_mul``, ``scale_div``, ``fill``, ``add``, ``softmax``, ``dropout``, ``final``."""
    line: int
    args: tuple[ast.expr, ...] = ()
    guard: ast.expr | None = None


class _Reader:
    """Follows the scores from the score matmul to the weighted sum (see the module doc)."""

    def __init__(self, source: str, line: int) -> None:
        try:
            self.tree = ast.parse(source)
        except SyntaxError as exc:
            raise Unread(f"the file does not parse ({exc.msg} at line {exc.lineno})") from None
        self.line = line
        self.chain, self.fn = _enclosing(self.tree, line)
        cls = self.chain[-2] if len(self.chain) > 1 and isinstance(self.chain[-2], ast.ClassDef) else None
        self.cls: ast.ClassDef | None = cls
        args = self.fn.args.posonlyargs + self.fn.args.args
        self.self_name = args[0].arg if cls is not None and args else None

    # -- the walk ------------------------------------------------------------------------------
    def read(self) -> AttentionCode:
        block, start, matmul, q, k = self._start()
        ops: list[_Op] = []
        names: list[str] = []
        leaf: ast.AST = matmul
        i = start
        while True:
            inner, guard = _unguard(block[i])
            tracked, final = self._climb(inner, leaf, ops, guard)
            if final is not None:
                break
            if tracked is None:
                raise Unread(f"line {inner.lineno} does something fix cannot read with the scores")
            names.append(tracked)
            i += 1
            if i >= len(block):
                raise Unread(f"the scores in {tracked!r} are not multiplied by v in the same block")
            stmt = block[i]
            inner, _ = _unguard(stmt)
            uses = _loads(stmt, {tracked})
            if (
                isinstance(inner, ast.AugAssign)
                and isinstance(inner.target, ast.Name)
                and inner.target.id == tracked
            ):
                if uses:
                    raise Unread(f"line {inner.lineno} reads {tracked!r} twice")
                leaf = inner.target
            elif len(uses) != 1:
                lefts = [ops[0] for ops in map(matmul_operands, ast.walk(stmt)) if ops is not None]
                if any(u is left for u in uses for left in lefts):
                    raise Unread(f"line {stmt.lineno} reads the attention weights besides the weighted sum")
                what = "does not use" if not uses else "reads more than once"
                raise Unread(
                    f"line {stmt.lineno}, between the scores and the weighted sum, {what} {tracked!r}"
                )
            else:
                leaf = uses[0]
        return self._build(block[start].lineno, block[i], ops, names, final, q, k)

    def _start(self) -> tuple[list[ast.stmt], int, ast.expr, ast.expr, ast.expr]:
        for block in _blocks(self.fn):
            for i, stmt in enumerate(block):
                if isinstance(
                    stmt, ast.If | ast.For | ast.While | ast.With | ast.Try | ast.AsyncFor | ast.AsyncWith
                ):
                    continue
                if not stmt.lineno <= self.line <= (stmt.end_lineno or stmt.lineno):
                    continue
                found = [m for m in (_score_matmul(n) for n in ast.walk(stmt)) if m is not None]
                if len(found) != 1:
                    raise Unread(
                        f"line {self.line} holds {len(found) or 'no'} q @ k.transpose(-2, -1) products"
                        if found
                        else f"line {self.line} does not compute q @ k.transpose(-2, -1)"
                    )
                matmul, q, k = found[0]
                return block, i, matmul, q, k
        raise Unread(f"no statement of {self.fn.name} holds line {self.line}")

    def _climb(
        self, stmt: ast.stmt, leaf: ast.AST, ops: list[_Op], guard: ast.expr | None
    ) -> tuple[str | None, ast.expr | None]:
        """Classify every node from ``leaf`` up to ``stmt``: (the name the value is stored in, the final
        matmul when this statement holds it)."""
        parents = _parents(stmt)
        if isinstance(stmt, ast.AugAssign) and stmt.target is leaf:
            kind = {ast.Mult: "scale_mul", ast.Div: "scale_div", ast.Add: "add"}.get(type(stmt.op))
            if kind is None:
                raise Unread(f"line {stmt.lineno} changes the scores with an operator fix cannot read")
            ops.append(_Op(kind, stmt.lineno, (stmt.value,), guard))
            return stmt.target.id if isinstance(stmt.target, ast.Name) else None, None
        node = leaf
        while True:
            parent = parents.get(id(node))
            if isinstance(parent, ast.Attribute) and parent.value is node:  # a method of the value: its call
                call = parents.get(id(parent))
                parent = call if isinstance(call, ast.Call) and call.func is parent else parent
            if parent is None or isinstance(parent, ast.stmt):
                break
            op = self._use(node, parent)
            if op is None:
                raise Unread(
                    f"line {stmt.lineno}: fix cannot read what {ast.unparse(parent)!r} does to the scores"
                )
            op.guard, op.line = guard, stmt.lineno
            ops.append(op)
            if op.kind == "final":
                if guard is not None:
                    raise Unread(f"line {stmt.lineno}: the weighted sum is under an if")
                return None, op.args[0]
            node = parent
        if isinstance(stmt, ast.Assign) and stmt.value is node and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                return target.id, None
        if (
            isinstance(stmt, ast.Expr)
            and stmt.value is node
            and isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "masked_fill_"
            and isinstance(node.func.value, ast.Name)
        ):
            return node.func.value.id, None  # in place: the scores stay in the same name
        raise Unread(f"line {stmt.lineno} does not store the scores in one plain name")

    def _use(self, node: ast.AST, parent: ast.AST) -> _Op | None:
        """How ``parent`` uses ``node`` (the scores or weights so far)."""
        if isinstance(parent, ast.BinOp):
            other = parent.right if parent.left is node else parent.left
            if isinstance(parent.op, ast.Mult):
                return _Op("scale_mul", 0, (other,))
            if isinstance(parent.op, ast.Div) and parent.left is node:
                return _Op("scale_div", 0, (other,))
            if isinstance(parent.op, ast.Add):
                return _Op("add", 0, (other,))
            if isinstance(parent.op, ast.MatMult) and parent.left is node:
                return _Op("final", 0, (parent, parent.right))
            return None
        if not isinstance(parent, ast.Call):
            return None
        func = parent.func
        if isinstance(func, ast.Attribute) and func.value is node:  # a method of the scores
            if func.attr in ("masked_fill", "masked_fill_") and len(parent.args) == 2 and not parent.keywords:
                return _Op("fill", 0, tuple(parent.args))
            if func.attr == "softmax":
                return self._softmax(parent, [*parent.args])
            ops = matmul_operands(parent)
            if ops is not None and ops[0] is node:
                return _Op("final", 0, (parent, ops[1]))
            return None
        if not parent.args or parent.args[0] is not node:
            return None
        name = dotted(func)
        if name in _SOFTMAX_FUNCS:
            return self._softmax(parent, [*parent.args[1:]])
        if name in _DROPOUT_FUNCS:
            return self._dropout_call(parent, name)
        ops = matmul_operands(parent)
        if ops is not None:
            return _Op("final", 0, (parent, ops[1]))
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == self.self_name
            and len(parent.args) == 1
            and not parent.keywords
        ):
            return _Op("dropout", 0, (self._dropout_module(func.attr, parent),))
        return None

    def _softmax(self, call: ast.Call, positional: list[ast.expr]) -> _Op | None:
        dims = positional[:1] + [kw.value for kw in call.keywords if kw.arg == "dim"]
        if len(dims) != 1 or const(dims[0]) != -1 or any(kw.arg not in ("dim",) for kw in call.keywords):
            raise Unread(f"line {call.lineno}: the softmax is not over the last dimension alone (dim=-1)")
        return _Op("softmax", 0, ())

    def _dropout_call(self, call: ast.Call, name: str) -> _Op:
        kw = {k.arg: k.value for k in call.keywords}
        p = call.args[1] if len(call.args) > 1 else kw.get("p")
        training = call.args[2] if len(call.args) > 2 else kw.get("training", kw.get("train"))
        if p is None:
            p = ast.Constant(0.5)  # F.dropout's default
        if training is None:
            if name == "torch.dropout":
                raise Unread(f"line {call.lineno}: torch.dropout without its train argument")
            training = ast.Constant(True)  # F.dropout's default
        if isinstance(training, ast.Constant) and training.value is True:
            return _Op("dropout", 0, (p,))
        return _Op("dropout", 0, (ast.IfExp(test=training, body=p, orelse=ast.Constant(0.0)),))

    def _dropout_module(self, attr: str, call: ast.Call) -> ast.expr:
        """``self.X.p if self.training else 0.0`` when ``self.X`` is built once, as an ``nn.Dropout``."""
        built = self._attribute(attr)
        if not (
            isinstance(built, ast.Call)
            and dotted(built.func) in ("nn.Dropout", "torch.nn.Dropout", "Dropout")
        ):
            raise Unread(
                f"line {call.lineno}: self.{attr} is not an nn.Dropout built in the class, so what it does is unknown"
            )
        owner = ast.Name(id=self.self_name or "self", ctx=ast.Load())
        module = ast.Attribute(value=owner, attr=attr, ctx=ast.Load())
        return ast.IfExp(
            test=ast.Attribute(
                value=ast.Name(id=self.self_name or "self", ctx=ast.Load()), attr="training", ctx=ast.Load()
            ),
            body=ast.Attribute(value=module, attr="p", ctx=ast.Load()),
            orelse=ast.Constant(0.0),
        )

    def _attribute(self, attr: str) -> ast.expr | None:
        """What ``self.attr`` is set to in the class, when it is set exactly once (a registered buffer too)."""
        if self.cls is None:
            return None
        found: list[ast.expr] = []
        for method in self.cls.body:
            if not isinstance(method, ast.FunctionDef) or not (method.args.posonlyargs + method.args.args):
                continue
            me = (method.args.posonlyargs + method.args.args)[0].arg
            for node in ast.walk(method):
                if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        if isinstance(t, ast.Attribute) and t.attr == attr and dotted(t.value) == me:
                            found.append(node.value if node.value is not None else t)
                            if isinstance(node, ast.AugAssign):
                                found.append(t)
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "register_buffer"
                    and dotted(node.func.value) == me
                    and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value == attr
                ):
                    found.append(node.args[1])
        return found[0] if len(found) == 1 else None

    def _local(self, name: str, before: int) -> ast.expr | None:
        """What the local ``name`` is set to in the function, when it is set exactly once, above ``before``."""
        found = [
            n
            for n in ast.walk(self.fn)
            if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.For | ast.With | ast.NamedExpr)
            and any(isinstance(t, ast.Name) and t.id == name for t in _stores(n))
        ]
        if (
            len(found) != 1
            or found[0].lineno >= before
            or not isinstance(found[0], ast.Assign | ast.AnnAssign)
        ):
            return None
        node = found[0]
        if isinstance(node, ast.Assign) and (
            len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name)
        ):
            return None
        return node.value

    # -- masks, scale, dropout ----------------------------------------------------------------
    def _definition(self, node: ast.expr, before: int) -> tuple[ast.expr | None, str]:
        """(what a name or ``self.attr`` is defined as, where, for people)."""
        if isinstance(node, ast.Name):
            return self._local(node.id, before), node.id
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == self.self_name
        ):
            return self._attribute(node.attr), f"{self.self_name}.{node.attr}"
        if isinstance(node, ast.Call):  # built in place: torch.ones(T, T).tril() == 0
            return node, "built in place"
        return None, ast.unparse(node)

    def _triangle(self, node: ast.expr, before: int) -> tuple[str, str]:
        """(``tril`` / ``triu1`` / ``triu_inf`` / "", description) of a mask sliced from its top-left corner."""
        sliced = node
        if isinstance(node, ast.Subscript):
            if not top_left(node.slice):
                return "", ast.unparse(node)
            sliced = node.value
        definition, name = self._definition(sliced, before)
        if definition is None:
            return "", name
        if mutated(self.cls or self.fn, ast.unparse(sliced)):
            return "", f"{name}, changed in place after it is built"
        core = definition
        while True:
            if (
                isinstance(core, ast.Call)
                and isinstance(core.func, ast.Attribute)
                and core.func.attr in _RESHAPES
            ):
                core = core.func.value
            elif isinstance(core, ast.Subscript) and only_new_axes(core.slice):
                core = core.value
            else:
                break
        where = f"{name}: {_short(definition)}, line {definition.lineno}"
        if not isinstance(core, ast.Call):
            return "", where
        if dotted(core.func) in (
            "nn.Transformer.generate_square_subsequent_mask",
            "torch.nn.Transformer.generate_square_subsequent_mask",
        ):
            return "triu_inf", where
        fname = dotted(core.func)
        method = core.func.attr if isinstance(core.func, ast.Attribute) else ""
        if fname in ("torch.tril", "torch.triu"):
            base, rest = (core.args[0] if core.args else None), core.args[1:]
            which = fname.split(".")[1]
        elif method in ("tril", "triu") and isinstance(core.func, ast.Attribute):
            base, rest, which = core.func.value, list(core.args), method
        else:
            return "", where
        diagonal = [*rest, *(k.value for k in core.keywords if k.arg == "diagonal")]
        if len(diagonal) > 1 or any(k.arg not in ("diagonal",) for k in core.keywords):
            return "", where
        offset = const(diagonal[0]) if diagonal else 0
        shape = square(base)
        if shape == "ones" and which == "tril" and offset == 0:
            return "tril", where
        if shape == "ones" and which == "triu" and offset == 1:
            return "triu1", where
        if shape == "-inf" and which == "triu" and offset == 1:
            return "triu_inf", where
        return "", where

    def _boolean(self, cond: ast.expr, fill: ast.expr, line: int) -> Mask:
        """The mask of ``scores.masked_fill(cond, fill)``."""
        if not very_negative(fill):
            raise Unread(f"line {line} fills the masked scores with {ast.unparse(fill)}, not -inf")
        base, zero = polarity(cond)
        keep = negation(cond)
        if base is not None:
            kind, where = self._triangle(base, line)
            if (kind == "tril" and zero) or (kind == "triu1" and not zero):
                return Mask("causal", None, line, f"{ast.unparse(cond)} ({where}) filled with -inf")
        return Mask("boolean", keep, line, f"{ast.unparse(cond)} filled with -inf (line {line})")

    def _additive(self, added: ast.expr, line: int) -> Mask:
        kind, where = self._triangle(added, line)
        if kind == "triu_inf":
            return Mask("causal", None, line, f"+ {ast.unparse(added)} ({where})")
        return Mask("additive", added, line, f"+ {ast.unparse(added)} (line {line})")

    def _mask(self, op: _Op) -> Mask:
        mask = (
            self._boolean(op.args[0], op.args[1], op.line)
            if op.kind == "fill"
            else self._additive(op.args[0], op.line)
        )
        if op.guard is None:
            return mask
        # Under `if TEST:` the mask applies only sometimes: a conditional attn_mask, never is_causal.
        if op.kind == "fill":
            keep = negation(op.args[0])
            how = f"{ast.unparse(op.args[0])} filled with -inf when {ast.unparse(op.guard)} (line {op.line})"
            kind = "boolean"
        else:
            keep = op.args[0]
            how = f"+ {ast.unparse(op.args[0])} when {ast.unparse(op.guard)} (line {op.line})"
            kind = "additive"
        if kind == "additive" and is_not_none(op.guard, keep):
            return Mask(kind, keep, op.line, how)  # attn_mask=None is no mask: the test is SDPA's own
        return Mask(kind, ast.IfExp(test=op.guard, body=keep, orelse=ast.Constant(None)), op.line, how)

    def _default_scale(self, factor: ast.expr, divide: bool, q: ast.expr, k: ast.expr) -> bool:
        """True when multiplying by ``factor`` (dividing, with ``divide``) is 1/sqrt(q's last dimension)."""
        root: ast.expr | None
        if divide:
            root = sqrt_of(factor)
        elif isinstance(factor, ast.BinOp) and isinstance(factor.op, ast.Div) and const(factor.left) == 1:
            root = sqrt_of(factor.right)
        elif isinstance(factor, ast.BinOp) and isinstance(factor.op, ast.Pow) and const(factor.right) == -0.5:
            root = factor.left
        else:
            root = None
        if root is None:
            return False
        if isinstance(root, ast.Name):
            root = self._local(root.id, factor.lineno) or root
        return last_dim_of(root, {ast.unparse(q), ast.unparse(k)})

    def _build(
        self,
        first: int,
        statement: ast.stmt,
        ops: list[_Op],
        names: list[str],
        final: ast.expr | None,
        q: ast.expr,
        k: ast.expr,
    ) -> AttentionCode:
        assert final is not None
        v = ops[-1].args[1]
        masks = [o for o in ops if o.kind in ("fill", "add")]
        scales = [o for o in ops if o.kind in ("scale_mul", "scale_div")]
        softmaxes = [o for o in ops if o.kind == "softmax"]
        dropouts = [o for o in ops if o.kind == "dropout"]
        if len(softmaxes) != 1:
            raise Unread(
                "the scores go through no softmax" if not softmaxes else "the scores go through two softmaxes"
            )
        after_softmax = ops[ops.index(softmaxes[0]) + 1 : -1]
        if any(o.kind != "dropout" for o in after_softmax):
            bad = next(o for o in after_softmax if o.kind != "dropout")
            raise Unread(
                f"line {bad.line} changes the attention weights after the softmax, which the fused call cannot do"
            )
        if any(
            o.kind not in ("fill", "add", "scale_mul", "scale_div") for o in ops[: ops.index(softmaxes[0])]
        ):
            raise Unread("the scores are changed before the softmax in a way fix cannot read")
        if len(masks) > 1:
            raise Unread(f"the scores are masked twice (lines {masks[0].line} and {masks[1].line})")
        if len(scales) > 1:
            raise Unread(f"the scores are scaled twice (lines {scales[0].line} and {scales[1].line})")
        if len(dropouts) > 1:
            raise Unread("the weights go through two dropouts")
        if scales and scales[0].guard is not None:
            raise Unread(f"line {scales[0].line} scales the scores only under an if")
        if scales and masks and masks[0].kind == "add" and ops.index(scales[0]) > ops.index(masks[0]):
            raise Unread(f"line {scales[0].line} scales the scores after the mask was added to them")
        if dropouts and dropouts[0].guard is not None:
            raise Unread(f"line {dropouts[0].line} applies dropout only under an if")
        mask = self._mask(masks[0]) if masks else None
        scale: ast.expr | None
        if not scales:
            scale = ast.Constant(1.0)  # the code does not scale: SDPA's default 1/sqrt(d) would
        else:
            factor, divide = scales[0].args[0], scales[0].kind == "scale_div"
            if self._default_scale(factor, divide, q, k):
                scale = None
            else:
                scale = ast.BinOp(left=ast.Constant(1.0), op=ast.Div(), right=factor) if divide else factor
        tracked = set(names)
        parts = [q, k, v] + ([mask.node] if mask is not None and mask.node is not None else [])
        if any(_loads(p, tracked) for p in parts):
            raise Unread("q, k, v or the mask read the scores themselves")
        uses_in_output = _loads(statement, tracked)
        if len(uses_in_output) > 1 or (uses_in_output and not _within(uses_in_output[0], final)):
            raise Unread(f"line {statement.lineno} reads the attention weights besides the weighted sum")
        end = statement.end_lineno or statement.lineno
        later = [n for n in _loads(self.fn, tracked) if n.lineno > end]
        if later:
            raise Unread(f"line {later[0].lineno} reads {later[0].id!r} after the weighted sum")
        qualname = ".".join(getattr(n, "name", "") for n in self.chain)
        def_line = min([self.fn.lineno, *(d.lineno for d in self.fn.decorator_list)])
        return AttentionCode(
            function=qualname,
            def_line=def_line,
            first=first,
            last=end,
            q=q,
            k=k,
            v=v,
            mask=mask,
            scale=scale,
            dropout=dropouts[0].args[0] if dropouts else None,
            functional=self._functional(),
            output=final,
            statement=statement,
            names=tuple(dict.fromkeys(names)),
        )

    def _functional(self) -> str:
        """How to name ``torch.nn.functional`` in this file: as the function's own calls do, else from its imports."""
        for node in ast.walk(self.fn):
            if isinstance(node, ast.Call):
                head = dotted(node.func).rpartition(".")[0]
                if head in _FUNCTIONAL and dotted(node.func).endswith(("softmax", "dropout", SDPA)):
                    return head
        names: dict[str, str] = {}
        for stmt in self.tree.body:
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    names[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
            elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                for alias in stmt.names:
                    names[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
        for name, full in names.items():
            if full == "torch.nn.functional":
                return name
        for name, full in names.items():
            if full == "torch.nn":
                return f"{name}.functional"
        if names.get("torch") == "torch":
            return "torch.nn.functional"
        raise Unread(
            "the file imports neither torch nor torch.nn.functional at its top, to call the fused attention through"
        )


def _unguard(stmt: ast.stmt) -> tuple[ast.stmt, ast.expr | None]:
    """``(inner statement, test)`` for ``if TEST: <one statement>`` without else; else ``(stmt, None)``."""
    if isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1:
        return stmt.body[0], stmt.test
    return stmt, None


def _stores(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        targets: list[ast.expr] = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.NamedExpr):
        targets = [node.target]
    elif isinstance(node, ast.With):
        targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
    else:
        targets = []
    out: list[ast.expr] = []
    for t in targets:
        out.extend(n for n in ast.walk(t) if isinstance(n, ast.Name))
    return out


def _short(node: ast.AST, width: int = 60) -> str:
    text = ast.unparse(node)
    return text if len(text) <= width else text[: width - 3] + "..."


def _within(node: ast.AST, root: ast.AST) -> bool:
    return any(n is node for n in ast.walk(root))


def read_attention(source: str, line: int) -> AttentionCode:
    """The attention whose scores ``q @ k.transpose(-2, -1)`` are computed at ``line`` of ``source``;
    raises :class:`Unread` (the reason in one sentence) when it cannot be read with certainty."""
    return _Reader(source, line).read()

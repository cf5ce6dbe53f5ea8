"""Static analysis: parse a Python file once and let every static rule read the same AST.

A static rule is a :class:`StaticRule` subclass: its :class:`~torchscalpel.doctor.rule.RuleInfo`
and a ``check(ctx: StaticContext) -> Iterable[Finding]`` that builds each finding with
``ctx.finding(INFO, node, message, ...)``. The classes are listed in
:mod:`torchscalpel.doctor.catalogue` (importing a rule module registers nothing); running them over
files is :mod:`torchscalpel.doctor.static_scan`, above the catalogue. The context resolves import
aliases (``nn.Linear`` -> ``torch.nn.Linear``) and knows which classes in the file are ``nn.Module``
subclasses, so rules stay short and precise.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from torchscalpel.doctor.rule import Rule, RuleInfo
from torchscalpel.findings import Finding, Location, Severity

# Base classes (fully qualified) whose subclasses are modules, beyond classes defined in the file.
_MODULE_BASES = {
    "torch.nn.Module",
    "torch.nn.modules.module.Module",
    "torch.nn.Sequential",
    "torch.nn.ModuleList",
    "lightning.LightningModule",
    "pytorch_lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "transformers.PreTrainedModel",
}
# The largest file the static rules read: far beyond any hand-written script, and a bound on the parse's
# memory and time (a 60 MB generated file is reported as not analysed instead of taking minutes).
MAX_SOURCE_BYTES = 8 << 20
# torch.nn attributes that start with a capital letter but do not construct a module.
_NOT_MODULES = {"Parameter", "UninitializedParameter", "UninitializedBuffer", "Buffer", "ParameterDict"}


class StaticRule(Rule):
    """A rule that reads one parsed file: set :attr:`info` and implement :meth:`check`."""

    def check(self, ctx: StaticContext) -> Iterable[Finding]:
        """The findings of this rule in the file ``ctx`` holds."""
        raise NotImplementedError


@dataclass(kw_only=True, slots=True)
class StaticContext:
    """One parsed file plus the helpers rules share."""

    path: str
    source: str
    tree: ast.Module
    aliases: dict[str, str] = field(default_factory=dict)
    """Local name -> fully qualified name, from the file's imports."""
    module_classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    """Classes in this file that subclass nn.Module (directly or through another such class)."""

    @classmethod
    def parse(cls, source: str, path: str) -> StaticContext:
        """Parse ``source``; raise SyntaxError as ast does."""
        tree = ast.parse(source, filename=path)
        ctx = cls(path=path, source=source, tree=tree)
        ctx.aliases = _collect_aliases(tree)
        ctx.module_classes = _module_classes(ctx)
        return ctx

    def qualname(self, node: ast.AST) -> str | None:
        """Dotted name of a Name/Attribute chain with the first part resolved through imports."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        head = self.aliases.get(node.id, node.id)
        return ".".join([head, *reversed(parts)])

    def call_name(self, node: ast.AST) -> str | None:
        """Qualified name of the function a Call calls, else None."""
        return self.qualname(node.func) if isinstance(node, ast.Call) else None

    def is_module_ctor(self, node: ast.AST) -> bool:
        """True when ``node`` is a call that constructs an nn.Module (torch.nn class or a module class here)."""
        if not isinstance(node, ast.Call):
            return False
        name = self.call_name(node)
        if name is None:
            return False
        if name in self.module_classes:
            return True
        if name.startswith("torch.nn.") and name.count(".") == 2:
            last = name.rsplit(".", 1)[1]
            return last[:1].isupper() and last not in _NOT_MODULES
        return False

    def location(self, node: ast.AST) -> Location:
        """``file:line`` of ``node``."""
        return Location(
            file=self.path, line=getattr(node, "lineno", 1), column=getattr(node, "col_offset", 0) + 1
        )

    def finding(
        self,
        info: RuleInfo,
        node: ast.AST,
        message: str,
        *,
        evidence: Iterable[str] = (),
        fix: str = "",
        severity: Severity | None = None,
    ) -> Finding:
        """A static finding of rule ``info`` located at ``node``; the source line is added as evidence."""
        shown = list(evidence)
        line = self.line_text(node)
        if line:
            shown.append(f"{self.path}:{getattr(node, 'lineno', 1)}: {line}")
        return info.finding(
            message,
            evidence=shown,
            fix=fix,
            location=self.location(node),
            source="static",
            severity=severity,
        )

    def line_text(self, node: ast.AST) -> str:
        """The stripped source line where ``node`` starts."""
        lines = self.source.splitlines()
        idx = getattr(node, "lineno", 0) - 1
        return lines[idx].strip() if 0 <= idx < len(lines) else ""

    def calls(self, root: ast.AST | None = None) -> Iterator[ast.Call]:
        """Every Call node under ``root`` (default: the whole file), nested functions' included."""
        for node in ast.walk(root or self.tree):
            if isinstance(node, ast.Call):
                yield node

    def own_calls(
        self, scope: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    ) -> list[ast.Call]:
        """The calls ``scope`` itself makes (:func:`own_nodes`), in source order."""
        found = [n for n in own_nodes(scope) if isinstance(n, ast.Call)]
        return sorted(found, key=lambda c: (c.lineno, c.col_offset))

    def scopes(self) -> Iterator[ast.Module | ast.FunctionDef | ast.AsyncFunctionDef]:
        """The file's top level and every function in it: the units a rule that pairs two statements reads."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef):
                yield node

    def mentions_attr(self, attr: str) -> bool:
        """True when ``.attr`` or a name ``attr`` appears anywhere in the file."""
        for node in ast.walk(self.tree):
            if (isinstance(node, ast.Attribute) and node.attr == attr) or (
                isinstance(node, ast.Name) and node.id == attr
            ):
                return True
        return False


NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
"""Nodes whose body runs when they are called, not where they are written."""


def local_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and the nodes it contains, in source order, without the bodies of the functions, lambdas and
    classes among them: a nested ``def`` is yielded (its name is bound where it stands) but not entered, because
    its body runs when it is called, not where it is written."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if isinstance(current, NESTED_SCOPES):
            continue  # its decorators and defaults are evaluated here, but are left out with its body: rare
        stack.extend(reversed(list(ast.iter_child_nodes(current))))


def own_nodes(scope: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> Iterator[ast.AST]:
    """The nodes of ``scope``'s own body (:func:`local_nodes` of each statement), in source order: what runs when
    the scope runs. A rule that pairs a call in ``main()`` with one in a ``def`` inside it would pair code that
    runs at different times, or never."""
    for stmt in scope.body:
        yield from local_nodes(stmt)


def self_attr_target(node: ast.AST) -> str | None:
    """``name`` for an assignment target ``self.name``, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def methods(cls: ast.ClassDef) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The methods defined directly in ``cls``."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _collect_aliases(tree: ast.Module) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    aliases.setdefault(top, top)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    # `import torch.nn as nn` and `from torch import nn` both give nn -> torch.nn already.
    return aliases


def _module_classes(ctx: StaticContext) -> dict[str, ast.ClassDef]:
    classes = {n.name: n for n in ast.walk(ctx.tree) if isinstance(n, ast.ClassDef)}
    found: dict[str, ast.ClassDef] = {}
    changed = True
    while changed:  # fixpoint: a subclass of a module class defined here is a module class too
        changed = False
        for name, cls in classes.items():
            if name in found:
                continue
            for base in cls.bases:
                qn = ctx.qualname(base)
                if qn and (
                    qn in _MODULE_BASES or qn in found or (qn.startswith("torch.nn.") and qn.count(".") == 2)
                ):
                    found[name] = cls
                    changed = True
                    break
    return found


@dataclass(frozen=True, slots=True)
class NotAnalysed:
    """A file the static rules could not read: ``line`` (1-based) where its syntax error is, if any."""

    path: str
    reason: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.reason}"

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "line": self.line, "reason": self.reason}


MAX_TERMS_BEFORE_311 = 50_000
"""Operators in one statement above which Python 3.10's parser is not asked: it has no recursion guard
and crashes the process (a segfault at a 200,000-term sum, measured) where 3.11+ raises RecursionError."""


def _longest_statement(source: str) -> int:
    """The most operator tokens in one logical line (0 when the text does not tokenize: the parser says why)."""
    import io
    import tokenize

    longest = count = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.OP:
                count += 1
            elif token.type == tokenize.NEWLINE:
                longest, count = max(longest, count), 0
    except (tokenize.TokenError, SyntaxError, ValueError):
        pass
    return max(longest, count)


def parse_source(source: str, path: str) -> StaticContext | NotAnalysed:
    """The parsed file, or why it cannot be analysed (a syntax error with its line, null bytes, an
    expression nested or chained too deeply for the parser)."""
    if sys.version_info < (3, 11) and _longest_statement(source) > MAX_TERMS_BEFORE_311:
        return NotAnalysed(path, "an expression is nested or chained too deeply for Python's parser")
    try:
        return StaticContext.parse(source, path)
    except SyntaxError as exc:
        return NotAnalysed(path, f"{exc.msg} (a syntax error); fix it and run again", exc.lineno)
    except ValueError as exc:  # source with null bytes
        return NotAnalysed(path, f"{exc}")
    except (RecursionError, MemoryError):
        return NotAnalysed(path, "an expression is nested or chained too deeply for Python's parser")

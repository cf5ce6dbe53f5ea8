"""Static model rules: modules in plain containers, unregistered tensor attributes, modules built in forward,
``super().__init__()`` missing or after the first submodule."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.static import StaticContext, StaticRule, methods, self_attr_target
from torchscalpel.findings import Finding, Severity

# Tensor factories whose result stored on ``self`` is a plain tensor attribute.
_FACTORIES = {
    "tensor",
    "zeros",
    "ones",
    "randn",
    "rand",
    "randint",
    "arange",
    "eye",
    "full",
    "empty",
    "linspace",
    "logspace",
    "zeros_like",
    "ones_like",
    "randn_like",
    "full_like",
    "empty_like",
    "as_tensor",
    "from_numpy",
    "triu",
    "tril",
    "FloatTensor",
    "LongTensor",
    "Tensor",
}
# Modules without parameters: creating them in forward wastes time but trains nothing wrong.
_PARAM_FREE = re.compile(
    r"(\w*Loss|ReLU\d*|GELU|SiLU|ELU|SELU|CELU|Tanh|Tanhshrink|Sigmoid|LogSigmoid|Hardsigmoid|Hardtanh|Hardswish|"
    r"Softmax\d*d?|LogSoftmax|Softmin|Softplus|Softsign|Mish|LeakyReLU|Threshold|GLU|Dropout\w*|AlphaDropout|"
    r"Identity|Flatten|Unflatten|\w*Pool\w*|Upsample\w*|PixelShuffle|PixelUnshuffle|\w*Pad\dd|ChannelShuffle|"
    r"CosineSimilarity|PairwiseDistance|Fold|Unfold)$"
)


def _module_elements(ctx: StaticContext, value: ast.AST) -> list[ast.AST]:
    """Module-constructing expressions inside a container literal or comprehension, else []."""
    if isinstance(value, ast.List | ast.Tuple | ast.Set):
        return [e for e in value.elts if ctx.is_module_ctor(e)]
    if isinstance(value, ast.Dict):
        return [v for v in value.values if v is not None and ctx.is_module_ctor(v)]
    if isinstance(value, ast.ListComp | ast.SetComp | ast.GeneratorExp):
        return [value.elt] if ctx.is_module_ctor(value.elt) else []
    if isinstance(value, ast.DictComp):
        return [value.value] if ctx.is_module_ctor(value.value) else []
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult):  # [nn.Linear(4, 4)] * 3
        return _module_elements(ctx, value.left) or _module_elements(ctx, value.right)
    if isinstance(value, ast.Call) and ctx.call_name(value) in {"list", "tuple", "dict"} and value.args:
        return _module_elements(ctx, value.args[0])
    return []


def _holds_state(ctx: StaticContext, element: ast.AST) -> bool:
    """False for a torch module that holds no parameter nor buffer (``nn.ReLU()``, a loss, dropout): in a plain
    list it has nothing the optimizer, ``.to()`` or the state_dict would miss."""
    name = ctx.call_name(element) or ""
    return not (name.startswith("torch.nn.") and _PARAM_FREE.match(name.rsplit(".", 1)[-1]))


def _wrapped_later(ctx: StaticContext, cls: ast.ClassDef, attr: str) -> bool:
    """True when the class also assigns ``self.attr = nn.ModuleList/ModuleDict/Sequential(...)`` somewhere."""
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and any(self_attr_target(t) == attr for t in node.targets):
            name = ctx.call_name(node.value) or ""
            if name.rsplit(".", 1)[-1] in {"ModuleList", "ModuleDict", "Sequential"}:
                return True
        if (
            isinstance(node, ast.Call)
            and ctx.call_name(node)
            and (ctx.call_name(node) or "").endswith("add_module")
        ):
            return True
    return False


def module_in_plain_container(ctx: StaticContext) -> Iterator[Finding]:
    """``self.x = [nn.Linear(...), ...]`` (list/tuple/dict/comprehension, or ``self.x = []`` + append) in a module class."""
    for cls in ctx.module_classes.values():
        empty_lists: dict[str, ast.AST] = {}
        for node in ast.walk(cls):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if (
                        isinstance(target, ast.Subscript) and node.value is not None
                    ):  # self.heads["a"] = Block()
                        attr = self_attr_target(target.value)
                        if (
                            attr in empty_lists
                            and ctx.is_module_ctor(node.value)
                            and _holds_state(ctx, node.value)
                            and not _wrapped_later(ctx, cls, attr)
                        ):
                            yield _container_finding(
                                ctx,
                                empty_lists.pop(attr),
                                cls,
                                attr,
                                ast.Dict(keys=[], values=[]),
                                node.value,
                            )
                        continue
                    attr = self_attr_target(target)
                    if attr is None or node.value is None:
                        continue
                    elements = [e for e in _module_elements(ctx, node.value) if _holds_state(ctx, e)]
                    if elements and not _wrapped_later(ctx, cls, attr):
                        yield _container_finding(ctx, node, cls, attr, node.value, elements[0])
                    elif (
                        isinstance(node.value, ast.List | ast.Dict)
                        and not getattr(node.value, "elts", None)
                        and not getattr(node.value, "keys", None)
                    ):
                        empty_lists[attr] = node
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"append", "extend", "insert", "__setitem__"}
            ):
                attr = self_attr_target(node.func.value)
                if (
                    attr in empty_lists
                    and any(
                        (ctx.is_module_ctor(a) and _holds_state(ctx, a))
                        or any(_holds_state(ctx, e) for e in _module_elements(ctx, a))
                        for a in node.args
                    )
                    and not _wrapped_later(ctx, cls, attr)
                ):
                    yield _container_finding(
                        ctx, empty_lists.pop(attr), cls, attr, ast.List(elts=[]), node.args[-1]
                    )


def _container_finding(
    ctx: StaticContext, node: ast.AST, cls: ast.ClassDef, attr: str, value: ast.AST, element: ast.AST
) -> Finding:
    is_dict = isinstance(value, ast.Dict | ast.DictComp) or (ctx.call_name(value) == "dict")
    kind = "dict" if is_dict else "tuple" if isinstance(value, ast.Tuple) else "list"
    wrapper = "nn.ModuleDict" if is_dict else "nn.ModuleList"
    elem = ctx.call_name(element) or "a module"
    return ctx.finding(
        MODULE_IN_PLAIN_CONTAINER,
        node,
        f"{cls.name}.{attr} holds modules ({elem.rsplit('.', 1)[-1]}) in a plain {kind}: their parameters are invisible "
        "to .parameters(), the optimizer, .to() and the state_dict.",
        fix=f"self.{attr} = {wrapper}(...)  # instead of a plain {kind}",
    )


def tensor_attribute_not_registered(ctx: StaticContext) -> Iterator[Finding]:
    """``self.x = torch.zeros(...)`` (a tensor factory, possibly chained) in a module class's methods."""
    for cls in ctx.module_classes.values():
        for method in methods(cls):
            if method.name == "forward":
                continue  # temporaries built in forward are created on the right device each call
            for node in ast.walk(method):
                if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                    continue
                attr = self_attr_target(node.targets[0])
                if attr is None or not _is_tensor_factory(ctx, node.value):
                    continue
                yield ctx.finding(
                    TENSOR_ATTRIBUTE_NOT_REGISTERED,
                    node,
                    f"{cls.name}.{attr} is a plain tensor attribute: model.to(device) leaves it behind and "
                    "state_dict() does not save it.",
                    fix=f"self.register_buffer({attr!r}, <tensor>)  # or nn.Parameter(<tensor>) if it is trained",
                )


def _is_tensor_factory(ctx: StaticContext, value: ast.AST) -> bool:
    # Walk down method chains like torch.ones(3, 3).tril().bool()
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        name = ctx.call_name(value) or ""
        if name.startswith("torch.") and name.count(".") == 1:
            return name.split(".")[1] in _FACTORIES
        value = value.func.value
    if isinstance(value, ast.Call):
        name = ctx.call_name(value) or ""
        return name.startswith("torch.") and name.count(".") == 1 and name.split(".")[1] in _FACTORIES
    return False


def module_created_in_forward(ctx: StaticContext) -> Iterator[Finding]:
    """A module with parameters constructed inside ``forward``."""
    for cls in ctx.module_classes.values():
        for method in methods(cls):
            if method.name != "forward":
                continue
            for call in ctx.calls(method):
                if not ctx.is_module_ctor(call):
                    continue
                name = (ctx.call_name(call) or "").rsplit(".", 1)[-1]
                if _PARAM_FREE.match(name):
                    continue
                yield ctx.finding(
                    MODULE_CREATED_IN_FORWARD,
                    call,
                    f"{cls.name}.forward builds a new {name} on every call: its weights are fresh random values each "
                    "step, are never trained, and never reach the optimizer.",
                    fix=f"# in __init__:\nself.layer = nn.{name}(...)\n# in forward:\nx = self.layer(x)",
                )


def _is_super_init(ctx: StaticContext, call: ast.Call, cls: ast.ClassDef) -> bool:
    """``super().__init__(...)``, ``super(Net, self).__init__(...)``, ``nn.Module.__init__(self)`` or
    ``Base.__init__(self, ...)`` for a base of ``cls``."""
    if not isinstance(call.func, ast.Attribute) or call.func.attr != "__init__":
        return False
    owner = call.func.value
    if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
        return True
    bases = {ast.unparse(b) for b in cls.bases} | {ctx.qualname(b) or "" for b in cls.bases}
    name = ast.unparse(owner)
    return name in bases or (ctx.qualname(owner) or "") in bases | {"torch.nn.Module"}


def _registers(ctx: StaticContext, value: ast.AST) -> str | None:
    """What assigning ``value`` to ``self.x`` registers on a module: a submodule or a parameter, else None."""
    if ctx.is_module_ctor(value):
        return "submodule"
    name = ctx.call_name(value) or ""
    if name.rsplit(".", 1)[-1] == "Parameter":
        return "parameter"
    return None


def super_init_missing(ctx: StaticContext) -> Iterator[Finding]:
    """An nn.Module subclass whose ``__init__`` never calls the base ``__init__``, or assigns a submodule or
    parameter to ``self`` before it: ``nn.Module.__setattr__`` has nowhere to register them yet."""
    for cls in ctx.module_classes.values():
        init = next((m for m in methods(cls) if m.name == "__init__"), None)
        if init is None:
            continue
        calls = sorted(
            (c for c in ctx.calls(init) if _is_super_init(ctx, c, cls)),
            key=lambda c: (c.lineno, c.col_offset),
        )
        first = calls[0].lineno if calls else None
        early: ast.Assign | None = None
        what = ""
        for node in ast.walk(init):
            if isinstance(node, ast.Assign) and any(self_attr_target(t) for t in node.targets):
                kind = _registers(ctx, node.value)
                if (
                    kind
                    and (first is None or node.lineno < first)
                    and (early is None or node.lineno < early.lineno)
                ):
                    early, what = node, kind
        if calls and early is None:
            continue
        base = ast.unparse(cls.bases[0]) if cls.bases else "nn.Module"
        fix = (
            f"class {cls.name}({base}):\n    def __init__(self, ...):\n"
            "        super().__init__()          # first: sets up the registries of parameters and submodules\n"
            "        self.layer = nn.Linear(...)"
        )
        if not calls:
            yield ctx.finding(
                SUPER_INIT_MISSING,
                early or init,
                f"{cls.name}.__init__ never calls super().__init__(): nn.Module's registries of parameters, "
                "buffers and submodules are never created, so assigning a layer raises 'cannot assign module "
                "before Module.__init__() call' and the model cannot be built.",
                fix=fix,
            )
        else:
            yield ctx.finding(
                SUPER_INIT_MISSING,
                early,  # type: ignore[arg-type]
                f"{cls.name}.__init__ assigns a {what} (self.{self_attr_target(early.targets[0]) if early else ''}) "
                f"before super().__init__() on line {first}: nn.Module cannot register it yet and raises "
                "'cannot assign module before Module.__init__() call'.",
                evidence=[f"super().__init__() at {ctx.path}:{first}"],
                fix=fix,
            )


SUPER_INIT_MISSING = RuleInfo(
    slug="super-init-missing",
    severity=Severity.ERROR,
    category="model",
    summary="nn.Module subclass without super().__init__(), or with it after the first submodule",
    kinds=("static",),
)


class SuperInitMissingStatic(StaticRule):
    info = SUPER_INIT_MISSING
    check = staticmethod(super_init_missing)

    @classmethod
    def redundant(cls, findings: Sequence[Finding]) -> list[Finding]:
        """The crash this mistake causes (``script-failed``: "cannot assign module before Module.__init__()
        call") says the same thing with less: the static finding names the class and the fix."""
        if not any(f.rule in cls.slugs for f in findings):
            return []
        return [f for f in findings if f.rule == "script-failed" and "before Module.__init__()" in f.message]


MODULE_IN_PLAIN_CONTAINER = RuleInfo(
    slug="module-in-plain-container",
    severity=Severity.ERROR,
    category="model",
    summary="nn.Module held in a plain list/dict/tuple: its parameters are not registered",
    kinds=("static", "runtime"),
)


class ModuleInPlainContainerStatic(StaticRule):
    info = MODULE_IN_PLAIN_CONTAINER
    check = staticmethod(module_in_plain_container)


TENSOR_ATTRIBUTE_NOT_REGISTERED = RuleInfo(
    slug="tensor-attribute-not-registered",
    severity=Severity.WARNING,
    category="model",
    summary="tensor attribute that is neither parameter nor buffer: not moved by .to(), not saved",
    kinds=("static", "runtime"),
)


class TensorAttributeNotRegisteredStatic(StaticRule):
    info = TENSOR_ATTRIBUTE_NOT_REGISTERED
    check = staticmethod(tensor_attribute_not_registered)


MODULE_CREATED_IN_FORWARD = RuleInfo(
    slug="module-created-in-forward",
    severity=Severity.ERROR,
    category="model",
    summary="module constructed inside forward: fresh random weights every call, never trained",
    kinds=("static", "runtime"),
)


class ModuleCreatedInForwardStatic(StaticRule):
    info = MODULE_CREATED_IN_FORWARD
    check = staticmethod(module_created_in_forward)

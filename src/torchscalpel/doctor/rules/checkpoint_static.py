"""Static checkpoint rules: unsafe loading and whole-model saving."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchscalpel.doctor.finding import Finding, Severity
from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.static import StaticContext, StaticRule

_MODEL_NAMES = {"model", "net", "network", "module", "student", "teacher", "generator", "discriminator"}


def unsafe_torch_load(ctx: StaticContext) -> Iterator[Finding]:
    """``torch.load(..., weights_only=False)`` and ``pickle.load(s)``."""
    for call in ctx.calls():
        name = ctx.call_name(call)
        if name == "torch.load":
            flag = next((k.value for k in call.keywords if k.arg == "weights_only"), None)
            if isinstance(flag, ast.Constant) and flag.value is False:
                yield ctx.finding(
                    "unsafe-torch-load",
                    call,
                    "torch.load(weights_only=False) unpickles arbitrary objects: a tampered checkpoint runs code "
                    "on this machine.",
                    fix="state = torch.load(path, weights_only=True, map_location='cpu')\n"
                    "# or safetensors.torch.load_file(path)",
                )
        elif name in {"pickle.load", "pickle.loads", "dill.load", "cloudpickle.load"}:
            yield ctx.finding(
                "unsafe-torch-load",
                call,
                f"{name} runs arbitrary code from the file it reads; only use it on files you produced.",
                fix="# store tensors with safetensors and metadata as JSON:\n"
                "from safetensors.torch import load_file\nstate = load_file(path)",
            )


def _module_names(ctx: StaticContext) -> set[str]:
    """Variable names assigned a module constructor (or a wrapper of one) in this file."""
    names: set[str] = set()
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in {"to", "cuda", "cpu", "train", "eval"}:
                value = value.func.value
            if ctx.is_module_ctor(value):
                names.add(node.targets[0].id)
    return names


def whole_model_save(ctx: StaticContext) -> Iterator[Finding]:
    """``torch.save(model, path)`` where ``model`` is a module (not its state_dict)."""
    modules = _module_names(ctx)
    for call in ctx.calls():
        if ctx.call_name(call) != "torch.save" or not call.args:
            continue
        obj = call.args[0]
        name = obj.id if isinstance(obj, ast.Name) else obj.attr if isinstance(obj, ast.Attribute) else None
        if name is None or not (name in modules or name.lower() in _MODEL_NAMES or name.lower().endswith("_model")):
            continue
        yield ctx.finding(
            "whole-model-save",
            call,
            f"torch.save({name}) pickles the whole module: loading needs the exact class and file layout, "
            "and needs weights_only=False (arbitrary code).",
            fix=f"torch.save({name}.state_dict(), path)\n# load: model.load_state_dict(torch.load(path, weights_only=True))",
        )


class UnsafeTorchLoadStatic(StaticRule):
    info = RuleInfo(
        slug="unsafe-torch-load",
        severity=Severity.WARNING,
        category="checkpoint",
        summary="torch.load with weights_only=False (or pickle) runs arbitrary code",
        kinds=("static", "runtime"),
    )
    check = staticmethod(unsafe_torch_load)


class WholeModelSaveStatic(StaticRule):
    info = RuleInfo(
        slug="whole-model-save",
        severity=Severity.WARNING,
        category="checkpoint",
        summary="torch.save of a whole nn.Module instead of its state_dict",
        kinds=("static", "runtime"),
    )
    check = staticmethod(whole_model_save)

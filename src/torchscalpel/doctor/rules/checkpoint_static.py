"""Static checkpoint rules: unsafe loading and whole-model saving."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.static import StaticContext, StaticRule
from torchscalpel.findings import Finding, Severity

# Names that are modules in practice; names that are just as often something else (a label "encoder",
# a "policy" dict) count only when this file assigns them a module constructor (see _module_names).
_MODEL_NAMES = {
    "model",
    "net",
    "network",
    "module",
    "student",
    "teacher",
    "generator",
    "discriminator",
    "ema",
    "classifier",
    "backbone",
    "actor",
    "critic",
    "autoencoder",
    "vae",
    "unet",
    "gpt",
}
_MODEL_SUFFIXES = ("model", "_net", "net_", "_module")
_PICKLE_LOADS = {
    "pickle.load",
    "pickle.loads",
    "dill.load",
    "cloudpickle.load",
    "joblib.load",
    "pandas.read_pickle",
}
_PICKLE_DUMP = re.compile(r"\b(pickle|dill|cloudpickle|joblib)\.dump\b|\.to_pickle\(")
_PICKLE_NAME = re.compile(r"""["']([^"'\s]*?([\w.-]+\.(?:pkl|pickle|pck|pkl\.gz)))["']""")
_SIBLING_FILES = 200
_SKIP_FOLDERS = {"__pycache__", "site-packages", "node_modules", "venv", "build", "dist"}
_PREP_NAME = re.compile(r"prep|data|vocab|token|build|make|process|cache", re.I)
_SIBLING_BYTES = 1 << 20


def _pickle_names(text: str) -> set[str]:
    """Base names of pickle files (``meta.pkl``) written as string literals in ``text``."""
    return {m.group(2) for m in _PICKLE_NAME.finditer(text)}


def _own_pickle_writer(ctx: StaticContext) -> str | None:
    """``file:line`` where this repository writes the pickle this file reads, else None.

    The same file dumping a pickle (a cache: load if present, else compute and dump) counts; so does
    a file in this folder or the one above (a ``prepare.py`` next to ``train.py``, nanoGPT's
    ``data/<name>/prepare.py``) that dumps a pickle under a file name this file reads.
    """
    own = _PICKLE_DUMP.search(ctx.source)
    if own:
        return f"{Path(ctx.path).name}:{ctx.source.count(chr(10), 0, own.start()) + 1}"
    names = _pickle_names(ctx.source)
    if not names:
        return None
    here = Path(ctx.path).resolve()
    candidates: set[Path] = set()
    for folder in (here.parent, here.parent.parent):
        for pattern in ("*.py", "*/*.py", "*/*/*.py"):  # nanoGPT: train.py + data/<name>/prepare.py
            try:
                for path in folder.glob(pattern):
                    rel = path.relative_to(folder).parts[:-1]
                    if not any(p.startswith(".") or p in _SKIP_FOLDERS for p in rel):
                        candidates.add(path)
            except OSError:
                continue
            if len(candidates) > 20 * _SIBLING_FILES:
                break
    # Preparation scripts first (prepare.py, build_vocab.py, ...), then the nearest files.
    ordered = sorted(candidates, key=lambda p: (not _PREP_NAME.search(p.name), len(p.parts), str(p)))
    for path in ordered[:_SIBLING_FILES]:
        if path == here:
            continue
        try:
            if path.stat().st_size > _SIBLING_BYTES:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        dump = _PICKLE_DUMP.search(text)
        if dump and names & _pickle_names(text):
            return f"{path.name}:{text.count(chr(10), 0, dump.start()) + 1}"
    return None


def unsafe_torch_load(ctx: StaticContext) -> Iterator[Finding]:
    """``torch.load(..., weights_only=False)`` and ``pickle.load(s)`` (info when this repository
    writes that pickle itself)."""
    writer: str | bool | None = False  # looked up once, on the first pickle load
    for call in ctx.calls():
        name = ctx.call_name(call)
        if name == "torch.load":
            flag = next((k.value for k in call.keywords if k.arg == "weights_only"), None)
            if isinstance(flag, ast.Constant) and flag.value is False:
                yield ctx.finding(
                    UNSAFE_TORCH_LOAD,
                    call,
                    "torch.load(weights_only=False) unpickles arbitrary objects: a tampered checkpoint runs code "
                    "on this machine.",
                    fix="state = torch.load(path, weights_only=True, map_location='cpu')\n"
                    "# weights_only=True loads tensors, dicts, lists, numbers and strings; for anything else\n"
                    "# allow exactly what torch lists: torch.serialization.get_unsafe_globals_in_checkpoint(path)\n"
                    "# (numpy arrays: np.save / np.load instead)",
                )
        elif name in _PICKLE_LOADS:
            if writer is False:
                writer = _own_pickle_writer(ctx)
            fix = (
                "# plain data (vocabularies, configs, metadata): JSON needs no unpickling\n"
                "json.dump(meta, f)   ->   meta = json.load(f)   # note: JSON object keys become strings\n"
                "# arrays: np.save / np.load; tensors: torch.save + torch.load(path, weights_only=True)"
            )
            if writer:
                yield ctx.finding(
                    UNSAFE_TORCH_LOAD,
                    call,
                    f"{name} reads a pickle that this repository writes itself ({writer}): safe for files it "
                    "produced; JSON would make the file safe to share.",
                    fix=fix,
                    severity=Severity.INFO,
                )
            else:
                yield ctx.finding(
                    UNSAFE_TORCH_LOAD,
                    call,
                    f"{name} runs arbitrary code from the file it reads, and nothing in this repository writes "
                    "that file: only use it on files you produced.",
                    fix=fix,
                )


_UNWRAP = {"to", "cuda", "cpu", "train", "eval", "half", "float", "bfloat16", "double"}


def _strip(node: ast.AST) -> ast.AST:
    """``model.cpu()`` / ``model.to(dev)`` / ``model.module`` / ``copy.deepcopy(model)`` -> ``model``."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _UNWRAP:
            node = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr in {"module", "_orig_mod"}:
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "deepcopy"
            and node.args
        ):
            node = node.args[0]
        else:
            return node


def _module_names(ctx: StaticContext) -> set[str]:
    """Variable and ``self.`` attribute names assigned a module constructor (or a wrapper of one) in this file."""
    names: set[str] = set()
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None or len(targets) != 1:
                continue
            value = _strip(node.value)
            while (
                isinstance(value, ast.Call)
                and value.args
                and ctx.call_name(value)
                in {"torch.compile", "torch.nn.DataParallel", "torch.nn.parallel.DistributedDataParallel"}
            ):
                value = _strip(value.args[0])
            if not ctx.is_module_ctor(value):
                continue
            t = targets[0]
            if isinstance(t, ast.Name):
                names.add(t.id)
            elif isinstance(t, ast.Attribute):
                names.add(t.attr)
    return names


def _state_names(ctx: StaticContext) -> set[str]:
    """Names assigned something built from a ``state_dict()`` (``best_model = copy.deepcopy(model.state_dict())``)."""
    names: set[str] = set()
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "state_dict"
            for c in ast.walk(node.value)
        ):
            for t in node.targets:
                if isinstance(t, ast.Name | ast.Attribute):
                    names.add(t.id if isinstance(t, ast.Name) else t.attr)
    return names


def _modelish(
    node: ast.AST,
    modules: set[str],
    states: frozenset[str] | set[str] = frozenset(),
    holders: frozenset[str] | set[str] = frozenset(),
) -> str | None:
    """The source name of a saved expression that is a module (not its state_dict), else None. ``holders``:
    containers this file puts a module in (:func:`_module_holders`): their element ``best[0]`` counts (the fix,
    ``best[0].state_dict()``, is then one edit at the save)."""
    node = _strip(node)
    if isinstance(node, ast.Subscript):
        held = _holder_name(_strip(node.value))
        return ast.unparse(node) if held is not None and held in holders else None
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if name is None or (name in states and name not in modules):
        return None
    low = name.lower()
    if name in modules or low in _MODEL_NAMES or low.endswith(_MODEL_SUFFIXES):
        return name
    return None


def _holder_name(node: ast.AST) -> str | None:
    """``best`` / ``self.best`` as a container's name (None for anything else)."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _module_holders(ctx: StaticContext, modules: set[str]) -> set[str]:
    """Names of lists, tuples and dicts this file puts a module in, so a save of one of their elements is
    followed to the module: ``best = [copy.deepcopy(model), acc]``, ``best[0] = copy.deepcopy(model)``,
    ``best_models.append(model)``, ``folds[k] = {"model": model}`` (what a k-fold script saves at its end)."""
    states = _state_names(ctx)

    def holds(value: ast.AST) -> bool:
        if isinstance(value, ast.List | ast.Tuple | ast.Set):
            return any(holds(e) for e in value.elts)
        if isinstance(value, ast.Dict):
            return any(v is not None and holds(v) for v in value.values)
        return _modelish(value, modules, states) is not None

    holders: set[str] = set()
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and holds(node.value):
                    name = _holder_name(_strip(t.value))
                elif isinstance(node.value, ast.List | ast.Tuple | ast.Dict) and holds(node.value):
                    name = _holder_name(t)
                else:
                    name = None
                if name is not None:
                    holders.add(name)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"append", "insert", "add", "setdefault"}
            and node.args
            and holds(node.args[-1])
        ):
            name = _holder_name(node.func.value)
            if name is not None:
                holders.add(name)
    return holders


def _saved(
    ctx: StaticContext,
    call: ast.Call,
    modules: set[str],
    obj_index: int = 0,
    obj_kw: str = "obj",
    holders: frozenset[str] | set[str] = frozenset(),
) -> str | None:
    """What a save call pickles when it is a module: the positional/keyword object, an element of a
    container holding one (``best[0]``), or a dict literal holding one (``{"model": model, ...}``)."""
    obj = (
        call.args[obj_index]
        if len(call.args) > obj_index
        else next((k.value for k in call.keywords if k.arg == obj_kw), None)
    )
    if obj is None or isinstance(obj, ast.Starred):
        return None
    if isinstance(obj, ast.Dict):
        for v in obj.values:
            name = _modelish(v, modules, _state_names(ctx), holders)
            if name is not None:
                return name
        return None
    return _modelish(obj, modules, _state_names(ctx), holders)


def _save_helpers(ctx: StaticContext) -> dict[str, tuple[int, str]]:
    """Functions in this file that pass one of their parameters to torch.save as the saved object:
    name -> (index of that parameter at call sites, its name)."""
    helpers: dict[str, tuple[int, str]] = {}
    for fn in ast.walk(ctx.tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        # its own calls only: a torch.save in a def nested here saves that def's own parameter of the same name
        for call in ctx.own_calls(fn):
            if ctx.call_name(call) != "torch.save":
                continue
            obj = (
                call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "obj"), None)
            )
            if isinstance(obj, ast.Name) and obj.id in params:
                index = params.index(obj.id)
                if params and params[0] in {"self", "cls"}:
                    index -= 1  # called as self.helper(...)
                if index >= 0:
                    helpers[fn.name] = (index, obj.id)
    return helpers


def whole_model_save(ctx: StaticContext) -> Iterator[Finding]:
    """``torch.save(model, path)`` / ``torch.save(obj=self.model, f=...)`` / ``torch.save({"model": model})``
    where ``model`` is a module (not its state_dict), also through a helper function of this file that
    passes its argument on to torch.save."""
    modules = _module_names(ctx)
    holders = _module_holders(ctx, modules)
    helpers = _save_helpers(ctx)
    for call in ctx.calls():
        cname = ctx.call_name(call)
        name = None
        via = ""
        if cname == "torch.save":
            name = _saved(ctx, call, modules, holders=holders)
        else:
            fname = (
                call.func.id
                if isinstance(call.func, ast.Name)
                else call.func.attr
                if isinstance(call.func, ast.Attribute)
                else None
            )
            if fname in helpers:
                index, param = helpers[fname]
                name = _saved(ctx, call, modules, obj_index=index, obj_kw=param, holders=holders)
                via = f" (through {fname}(), which passes it to torch.save)"
        if name is None:
            continue
        yield ctx.finding(
            WHOLE_MODEL_SAVE,
            call,
            f"torch.save of {name}{via} pickles the whole module: loading needs the exact class and file layout, "
            "and needs weights_only=False (arbitrary code).",
            fix=f"torch.save({name}.state_dict(), path)\n# load: model.load_state_dict(torch.load(path, weights_only=True))",
        )


UNSAFE_TORCH_LOAD = RuleInfo(
    slug="unsafe-torch-load",
    severity=Severity.WARNING,
    category="checkpoint",
    summary="torch.load with weights_only=False (or pickle) runs arbitrary code",
    kinds=("static", "runtime"),
)


class UnsafeTorchLoadStatic(StaticRule):
    info = UNSAFE_TORCH_LOAD
    check = staticmethod(unsafe_torch_load)


WHOLE_MODEL_SAVE = RuleInfo(
    slug="whole-model-save",
    severity=Severity.WARNING,
    category="checkpoint",
    summary="torch.save of a whole nn.Module instead of its state_dict",
    kinds=("static", "runtime"),
)


class WholeModelSaveStatic(StaticRule):
    info = WHOLE_MODEL_SAVE
    check = staticmethod(whole_model_save)

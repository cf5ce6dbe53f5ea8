"""``save_state_dict`` (doctor's ``whole-model-save``): a checkpoint's format changes, so every reader
of it changes with it, or nothing does.

``torch.save(MODEL, PATH)`` becomes ``torch.save(MODEL.state_dict(), PATH)``. The file then holds a
dict of tensors, so a ``MODEL = torch.load(PATH)`` left as it was would hand the script a dict on its
next start (``AttributeError: 'collections.OrderedDict' object has no attribute 'train'``). Every
``torch.load`` in the same file that reads the same path becomes
``MODEL.load_state_dict(torch.load(PATH, ..., weights_only=True))``, on the same line, loading into
the model the script already built. The same path means the same expression as written (``args.save``,
``CKPT``, ``"ckpt/last.pt"``: string literals compared by value), looking through
``with open(EXPR, ...) as f`` on either side (pytorch/examples' word_language_model).

Refused, with the file and line, when a reader cannot be rewritten so: it assigns the loaded module
to another name than the saved one (loading into the training model would overwrite its weights), it
uses the result in place (``torch.load(p).eval()``), no model of that name is built before it in its
scope (``if exists: model = torch.load(p) else: model = Net()``), a ``MODEL = torch.load(...)`` or a
``torch.load(..., weights_only=False)`` (a pickled object: maybe this module) reads a path fix cannot
match to the saved one, or another Python file of the tree reads the saved path (a string literal
ending in the saved file's name found in its ``torch.load``: fix edits one file's readers with its
writer). A path that reaches another file through a variable or a command-line flag is not seen here:
``--verify``'s second start is what catches that reader.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from torchscalpel.fix.cst import (
    Edit,
    EditError,
    ReplaceAll,
    ancestors,
    callee_name,
    dotted,
    find_call,
    node_code,
    set_kwargs,
    walk_all,
    walk_nodes,
)

SKIPPED_DIRS = frozenset({".git", "__pycache__", "scalpel-runs", ".venv", "venv", "node_modules", ".tox"})
"""Not searched for other readers of a checkpoint: history, caches, runs and environments."""
MAX_SCANNED_FILES = 2000
"""Python files read in the tree when looking for readers in other files (a bound, not a guess: a
tree larger than this is refused as not fully searched)."""
MAX_SCANNED_BYTES = 1_000_000
"""A Python file larger than this is not a hand-written reader (generated code); it is skipped."""

_Key = tuple[str, str]
"""What a path expression means for matching: ``("literal", value)`` or ``("code", text)``."""


def _key(expr: cst.BaseExpression) -> _Key:
    code = node_code(expr)
    if isinstance(expr, cst.SimpleString | cst.ConcatenatedString):
        try:
            value = ast.literal_eval(code)
        except (ValueError, SyntaxError):
            value = None
        if isinstance(value, str):
            return ("literal", value)
    return ("code", "".join(code.split()))


def _path_arg(call: cst.Call, keyword: str) -> cst.BaseExpression | None:
    """The path argument of ``torch.save(obj, f)`` (``keyword`` "f", second positional) or
    ``torch.load(f)`` (first positional)."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    index = 1 if keyword == "f" and callee_name(call.func) == "save" else 0
    if len(positional) > index:
        return positional[index].value
    return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "f"), None)


def _opened(name: str, node: cst.CSTNode, parents: Any) -> cst.BaseExpression | None:
    """``EXPR`` when ``name`` is bound by an enclosing ``with open(EXPR, ...) as name``."""
    for a in ancestors(node, parents):
        if not isinstance(a, cst.With):
            continue
        for item in a.items:
            target = item.asname.name if item.asname is not None else None
            call = item.item
            if (
                isinstance(target, cst.Name)
                and target.value == name
                and isinstance(call, cst.Call)
                and dotted(call.func) in ("open", "io.open", "builtins.open")
                and call.args
                and call.args[0].keyword is None
            ):
                return call.args[0].value
    return None


def _path_key(call: cst.Call, parents: Any) -> tuple[_Key, str] | None:
    """The matching key of the path a save / load call names, and its code as written."""
    arg = _path_arg(call, "f")
    if arg is None:
        return None
    if isinstance(arg, cst.Name):
        opened = _opened(arg.value, call, parents)
        if opened is not None:
            arg = opened
    return _key(arg), node_code(arg)


def _is_torch_load(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and dotted(node.func) == "torch.load"


def _unpickles(call: cst.Call) -> bool:
    """``torch.load(..., weights_only=False)``: what it reads may be a whole module."""
    return any(
        a.keyword is not None and a.keyword.value == "weights_only" and node_code(a.value) == "False"
        for a in call.args
    )


def _inside_load_state_dict(call: cst.Call, parents: Any) -> bool:
    parent = parents.get(parents.get(call))  # Arg, then the call holding it
    return isinstance(parent, cst.Call) and callee_name(parent.func) == "load_state_dict"


def _where(file: str, line: int) -> str:
    return f"{file}:{line}" if file else f"line {line}"


def _assigned_before(
    target: str, reader: cst.CSTNode, line: int, wrapper: MetadataWrapper, parents: Any
) -> bool:
    """True when ``target`` (``model``, ``self.model``) holds a model before ``line`` in the reader's
    scope: assigned there from anything but ``torch.load``, a parameter of the enclosing function, or
    (``self.X``) set in the class's ``__init__``."""
    positions = wrapper.resolve(PositionProvider)
    scope: cst.CSTNode | None = next(
        (a for a in ancestors(reader, parents) if isinstance(a, cst.FunctionDef)), None
    )
    roots: list[cst.CSTNode] = [scope if scope is not None else wrapper.module]
    if isinstance(scope, cst.FunctionDef):
        params = [p.name.value for p in (*scope.params.posonly_params, *scope.params.params)]
        params += [p.name.value for p in scope.params.kwonly_params]
        if target in params:
            return True
        cls = parents.get(parents.get(scope))  # IndentedBlock, then the class
        if target.startswith("self.") and isinstance(cls, cst.ClassDef):
            roots += [
                f
                for f in walk_nodes(cls)
                if isinstance(f, cst.FunctionDef) and f.name.value == "__init__" and f is not scope
            ]
    for root in roots:
        for node in walk_nodes(root):
            if isinstance(node, cst.Assign):
                targets = [node_code(t.target) for t in node.targets]
                value: cst.BaseExpression | None = node.value
            elif isinstance(node, cst.AnnAssign):
                targets, value = [node_code(node.target)], node.value
            else:
                continue
            if target not in targets or value is None or _is_torch_load(value):
                continue
            if root is not roots[0] or positions[node].start.line < line:
                return True
    return False


def _rewrite_reader(
    load: cst.Call, model: str, file: str, line: int, wrapper: MetadataWrapper, parents: Any
) -> tuple[cst.CSTNode, cst.CSTNode]:
    """The statement ``MODEL = torch.load(...)`` holding ``load``, and its replacement
    ``MODEL.load_state_dict(torch.load(..., weights_only=True))``; refuses any other shape."""
    where = _where(file, line)
    assign = parents.get(load)
    if not (isinstance(assign, cst.Assign) and assign.value is load and len(assign.targets) == 1):
        raise EditError(
            f"{where} uses what torch.load reads in place, so fix cannot tell which model to load "
            "the state_dict into; change that line with the save by hand"
        )
    target = node_code(assign.targets[0].target)
    if target != model:
        raise EditError(
            f"{where} loads the checkpoint into {target}, not the saved {model}; loading it into "
            f"{model} would overwrite the trained weights, so change it by hand: {target} = "
            f"copy.deepcopy({model}); {target}.load_state_dict(torch.load(..., weights_only=True))"
        )
    if not _assigned_before(model, assign, line, wrapper, parents):
        raise EditError(
            f"{where} builds {model} by loading it, and no {model} is built before that line to load "
            "the state_dict into; build the model first, then load its state_dict"
        )
    safe = set_kwargs(load, Edit(kind="call_kwargs", callee="load", kwargs=(("weights_only", True),)))
    call = cst.Call(
        func=cst.Attribute(value=assign.targets[0].target, attr=cst.Name("load_state_dict")),
        args=[cst.Arg(value=safe)],
    )
    return assign, cst.Expr(value=call)


def save_state_dict(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """The ``save_state_dict`` edit with its readers (see the module doc); None when already done."""
    kw = dict(edit.kwargs)
    file = str(kw.get("file") or "")
    name = Path(file).name if file else ""
    call = find_call(wrapper, "save", edit.line)
    if dotted(call.func) not in ("torch.save", "save") or not call.args:
        raise EditError(f"line {edit.line} does not call torch.save")
    first = call.args[0]
    if first.keyword is not None or first.star:
        raise EditError("torch.save's first argument is not a plain positional one")
    value = first.value
    if isinstance(value, cst.Call) and callee_name(value.func) == "state_dict":
        return None
    if not isinstance(value, cst.Name | cst.Attribute):
        raise EditError("torch.save saves an expression, not a named module")
    model = node_code(value)
    parents = wrapper.resolve(ParentNodeProvider)
    positions = wrapper.resolve(PositionProvider)
    saved = _path_key(call, parents)
    if saved is None:
        raise EditError(f"torch.save at {_where(name, edit.line)} names no file to save to")
    replace: dict[cst.CSTNode, cst.CSTNode] = {}
    for load in (n for n in walk_all(module) if _is_torch_load(n)):
        assert isinstance(load, cst.Call)
        line = positions[load].start.line
        read = _path_key(load, parents)
        if _inside_load_state_dict(load, parents):
            continue  # reads a state_dict already: the new format is what it expects
        if read is not None and read[0] == saved[0]:
            old, new = _rewrite_reader(load, model, name, line, wrapper, parents)
            replace[old] = new
            continue
        assign = parents.get(load)
        source = read[1] if read else "a file"
        if isinstance(assign, cst.Assign) and any(node_code(t.target) == model for t in assign.targets):
            raise EditError(
                f"{_where(name, line)} loads {model} from {source}, which fix cannot match to the path "
                f"torch.save writes at line {edit.line} ({saved[1]}); change both by hand"
            )
        if _unpickles(load):  # a pickled object read from a path written another way: maybe this one
            raise EditError(
                f"{_where(name, line)} loads a pickled object (weights_only=False) from {source}, which fix "
                f"cannot match to the path torch.save writes at line {edit.line} ({saved[1]}); if it reads "
                "this checkpoint, change both by hand"
            )
    if saved[0][0] == "literal" and file:
        elsewhere = other_readers(Path(file), saved[0][1])
        if elsewhere:
            raise EditError(
                f"{elsewhere} also reads {saved[1]} with torch.load, and fix edits only the readers in "
                f"{name or 'the saving file'}; change that reader with the save by hand"
            )
    new_call = call.with_changes(
        args=[
            first.with_changes(value=cst.Call(func=cst.Attribute(value=value, attr=cst.Name("state_dict")))),
            *call.args[1:],
        ]
    )
    replace[call] = new_call
    return module.visit(ReplaceAll(replace))


def _whole_module_save(call: cst.Call) -> bool:
    """``torch.save(NAME, ...)`` / ``torch.save(self.NAME, ...)``: a module object, not its state_dict."""
    first = call.args[0] if call.args else None
    return (
        dotted(call.func) == "torch.save"
        and first is not None
        and first.keyword is None
        and not first.star
        and isinstance(first.value, cst.Name | cst.Attribute)
    )


def safe_load(module: cst.Module, wrapper: MetadataWrapper, edit: Edit) -> cst.Module | None:
    """``unsafe-torch-load``: ``weights_only=True`` on the ``torch.load`` at the line. When the same
    file saves a whole module to the path it reads, that file cannot be read so: the pair changes
    together, as :func:`save_state_dict` at that save (which sets ``weights_only=True`` here too)."""
    call = find_call(wrapper, "load", edit.line)
    if dotted(call.func) != "torch.load":
        raise EditError(
            f"line {edit.line} calls {dotted(call.func) or 'load'}, which has no weights_only; "
            "read that file with a format that needs no unpickling"
        )
    parents = wrapper.resolve(ParentNodeProvider)
    positions = wrapper.resolve(PositionProvider)
    read = _path_key(call, parents)
    if read is not None and not _inside_load_state_dict(call, parents):
        for save in walk_all(module):
            if not (isinstance(save, cst.Call) and _whole_module_save(save)):
                continue
            written = _path_key(save, parents)
            if written is not None and written[0] == read[0]:
                pair = dataclasses.replace(edit, kind="save_state_dict", line=positions[save].start.line)
                return save_state_dict(module, wrapper, pair)
    held = str(dict(edit.kwargs).get("held") or "")
    if held:
        # The run loaded more than weights from this file and no writer of it here is converted: on its
        # next start the patched script would refuse its own file (UnpicklingError).
        raise EditError(
            f"the file torch.load reads at line {edit.line} held {held} when the run loaded it, which "
            "weights_only=True refuses, and this file writes no whole module there for fix to convert; "
            "allow exactly those classes (torch.serialization.safe_globals) or save plain data"
        )
    new = set_kwargs(call, Edit(kind="call_kwargs", callee="load", kwargs=(("weights_only", True),)))
    if node_code(new) == node_code(call):
        return None
    return module.visit(ReplaceAll({call: new}))


def tree_of(file: Path) -> Path:
    """The tree a file belongs to: the nearest folder above it holding ``.git``, else its own folder."""
    for folder in file.resolve().parents:
        if (folder / ".git").exists():
            return folder
    return file.resolve().parent


def other_readers(file: Path, literal: str) -> str:
    """``other.py:LINE`` of the first ``torch.load`` in another Python file of ``file``'s tree whose
    path is the string ``literal`` (or a literal ending in its file name, joined there), "" when none."""
    root, target = tree_of(file), file.resolve()
    base = os.path.basename(literal)
    scanned = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for fname in sorted(f for f in files if f.endswith(".py")):
            path = Path(folder) / fname
            if path.resolve() == target:
                continue
            scanned += 1
            if scanned > MAX_SCANNED_FILES:
                return f"{root} (more than {MAX_SCANNED_FILES} Python files, not all searched)"
            try:
                if path.stat().st_size > MAX_SCANNED_BYTES:
                    continue
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if "load" not in text or base not in text:
                continue
            line = _literal_load_line(text, literal, base)
            if line:
                return f"{path.relative_to(root)}:{line}"
    return ""


def _literal_load_line(text: str, literal: str, base: str) -> int:
    """The line of a ``torch.load`` call in ``text`` that names ``literal`` (or a string ending in
    ``base`` inside its path argument), 0 when none."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return 0
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
        ):
            continue
        if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
            continue
        arg = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "f"), None)
        strings = (
            [n.value for n in ast.walk(arg) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            if arg is not None
            else []
        )
        if literal in strings or any(s.endswith(base) for s in strings if base):
            return node.lineno
    return 0


def with_file(edit: Edit, file: Path) -> Edit:
    """``edit`` carrying the path of the file it edits (other readers are searched from there)."""
    return dataclasses.replace(edit, kwargs=(*edit.kwargs, ("file", str(file))))

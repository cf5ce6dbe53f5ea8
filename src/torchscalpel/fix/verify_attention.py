"""``scalpel fix --verify`` for the attention edit: the patched function's outputs against the original's.

The functions the patch rewrote into ``scaled_dot_product_attention`` calls are found by comparing each
changed file before and after (:func:`rewritten`). The script then runs once more, in a fresh copy of
the original tree, as ``python attention_check.py SPEC OUT SCRIPT ARGS``
(:mod:`torchscalpel.fix.attention_check`, nothing of torchscalpel imported): at the first call of each
such function both versions run on that call's own arguments and on random ones of the same shapes,
in train and eval mode, dropout off, and the largest absolute difference is read back. Equal within
allclose's tolerance (fp32: 1e-5) is verified; a difference, or a check that could not run, is not,
with the reason.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from torchscalpel.console import Phase
from torchscalpel.trace.attention_code import SDPA

CHECKER = Path(__file__).with_name("attention_check.py")
TIMEOUT_S = 600


def _functions(source: str) -> dict[str, tuple[int, int]]:
    """Each function's qualified name: (its first line as ``co_firstlineno`` counts it, its fused calls)."""
    out: dict[str, tuple[int, int]] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                calls = _fused_calls(node)
                out[f"{prefix}{node.name}"] = (first, calls)
                walk(node.body, f"{prefix}{node.name}.")

    try:
        walk(ast.parse(source).body, "")
    except SyntaxError:
        return {}
    return out


def rewritten(before: str, after: str) -> list[tuple[str, int]]:
    """(qualified name, first line in ``before``) of each function ``after`` calls the fused attention in
    more often than ``before`` does."""
    old, new = _functions(before), _functions(after)
    return [(name, old[name][0]) for name, (_, calls) in new.items() if name in old and calls > old[name][1]]


def _fused_calls(root: ast.AST | str) -> int:
    """The fused attention calls in ``root`` (a source's text), its nested functions and classes left out."""
    if isinstance(root, str):
        try:
            root = ast.parse(root)
        except SyntaxError:
            return 0
        nested: tuple[type, ...] = ()
    else:
        nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    count, todo = 0, list(ast.iter_child_nodes(root))
    while todo:
        node = todo.pop()
        if isinstance(node, nested):
            continue
        if isinstance(node, ast.Call) and SDPA in (
            getattr(node.func, "attr", None),
            getattr(node.func, "id", None),
        ):
            count += 1
        todo.extend(ast.iter_child_nodes(node))
    return count


def _line(name: str, result: dict[str, Any]) -> tuple[bool, str]:
    if result.get("ok"):
        return True, (
            f"attention: {name} gives the original's outputs (max abs diff {result['max_abs_diff']:.1e}, "
            f"tolerance {result['tolerance']:.0e}; train and eval mode, dropout off; the script's own input "
            f"and a random one; {result['sdpa_calls']} fused call(s))"
        )
    if result.get("error"):
        return False, f"attention: {name}: not verified: {result['error']}"
    return False, (
        f"attention: {name} differs from the original (max abs diff {result.get('max_abs_diff', 0.0):.1e} over "
        f"the tolerance {result.get('tolerance', 0.0):.0e}; {', '.join(result.get('differs') or [])})"
    )


def verify_attention(
    changes: dict[Path, tuple[str, str]],
    folder: Path,
    script: str,
    args: list[str],
    original: Path,
    work: Path,
    notes: list[str],
) -> bool:
    """Check every rewritten attention function (see the module doc), a line each in ``notes``; True when
    all gave the original's outputs, or the patch rewrote none."""
    specs: list[dict[str, Any]] = []
    copy = work / "attention"
    for path, (before, after) in changes.items():
        rel = path.relative_to(folder)
        if _fused_calls(after) > _fused_calls(before) and not rewritten(before, after):
            notes.append(
                f"attention: not verified: the fused call in {rel} is outside any function fix can run"
            )
            return False
        for name, first in rewritten(before, after):
            specs.append(
                {
                    "file": str(copy / rel),
                    "first_line": first,
                    "qualname": name,
                    "patched": str(work / "patched" / rel),
                }
            )
    if not specs:
        return True
    shutil.copytree(original, copy, ignore=shutil.ignore_patterns("__pycache__"))
    spec_path, out = work / "attention-spec.json", work / "attention.json"
    spec_path.write_text(json.dumps(specs), encoding="utf-8")
    log = work / "attention.log"
    cmd = [sys.executable, str(CHECKER), str(spec_path), str(out), script, *args]
    with log.open("w", encoding="utf-8") as sink, Phase("verify", "attention outputs, original vs patched"):
        try:
            rc = subprocess.run(
                cmd, cwd=copy, stdout=sink, stderr=subprocess.STDOUT, timeout=TIMEOUT_S, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            notes.append(
                f"attention: not verified: the script did not reach the attention within {TIMEOUT_S} s ({log})"
            )
            return False
    try:
        results: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        notes.append(f"attention: not verified: the check exited {rc} without a result ({log})")
        return False
    ok = True
    for spec in specs:
        good, line = _line(spec["qualname"], results.get(spec["qualname"]) or {"error": "no result"})
        notes.append(line)
        ok = ok and good
    return ok

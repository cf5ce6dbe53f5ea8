"""Compare an attention function with its patched twin on the inputs the user's own script gives it.

Run by path, never imported by the script it checks::

    python attention_check.py SPEC.json OUT.json SCRIPT [ARGS ...]

It imports nothing of torchscalpel. SPEC lists the functions ``scalpel fix`` rewrote (``file``, the
function's ``first_line`` as ``co_firstlineno`` counts it, its ``qualname``, and ``patched``: the
patched copy of that file). It runs SCRIPT as ``__main__`` (as ``python SCRIPT`` would, in the copy of
the original tree) under a ``sys.setprofile`` hook that waits for the first call of each function. At
that call, before the call runs, it compiles the patched function from the patched file in the
original function's globals, and runs both on the call's own arguments (the same module instance: its
weights and buffers) and on random inputs of the same shapes, in train and in eval mode, without
gradients, autocast off and with dropout off (``F.dropout`` and ``torch.dropout`` return their input,
``scaled_dot_product_attention`` runs with ``dropout_p=0``), and records the largest absolute
difference of their outputs. When every function has been compared it writes OUT.json and leaves at
once (``os._exit(0)``); a script that ends first gets what was compared written at exit.
"""

from __future__ import annotations

import ast
import atexit
import json
import os
import runpy
import sys
from typing import Any

TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-3}
"""allclose's atol and rtol by output dtype: SDPA and the op-by-op softmax round differently."""


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _patched_function(spec: dict[str, Any], original: Any) -> Any:
    """The patched file's version of ``original``, compiled in ``original``'s globals (decorators left out)."""
    if original.__code__.co_freevars:
        raise RuntimeError(
            f"{spec['qualname']} reads variables of an enclosing scope ({', '.join(original.__code__.co_freevars)})"
        )
    with open(spec["patched"], encoding="utf-8") as f:
        tree = ast.parse(f.read())
    body: list[ast.stmt] = tree.body
    node: Any = None
    for part in spec["qualname"].split("."):
        node = next(
            (s for s in body if isinstance(s, ast.ClassDef | ast.FunctionDef) and s.name == part), None
        )
        if node is None:
            raise RuntimeError(f"the patched file has no {spec['qualname']}")
        body = node.body
    node.decorator_list = []
    code = compile(ast.Module(body=[node], type_ignores=[]), spec["patched"], "exec")
    space: dict[str, Any] = {}
    exec(code, original.__globals__, space)  # the user's own patched code, in the copied tree
    return space[node.name]


class _DropoutOff:
    """Dropout off everywhere while both versions run; counts the fused calls."""

    def __enter__(self) -> _DropoutOff:
        import torch
        import torch.nn.functional as F

        self.saved = (F.dropout, torch.dropout, F.scaled_dot_product_attention)
        self.sdpa_calls = 0
        sdpa = F.scaled_dot_product_attention

        def fused(*args: Any, **kwargs: Any) -> Any:
            self.sdpa_calls += 1
            if len(args) > 4:  # dropout_p is the fifth positional parameter
                args = (*args[:4], 0.0, *args[5:])
            else:
                kwargs["dropout_p"] = 0.0
            return sdpa(*args, **kwargs)

        F.dropout = lambda input, *a, **k: input
        torch.dropout = lambda input, *a, **k: input
        F.scaled_dot_product_attention = fused
        return self

    def __exit__(self, *exc: object) -> None:
        import torch
        import torch.nn.functional as F

        F.dropout, torch.dropout, F.scaled_dot_product_attention = self.saved


def _autocast_off() -> Any:
    """Autocast off on the CPU (and CUDA): the module's own dtype, whatever the script's step wraps it in."""
    import contextlib

    import torch

    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast("cpu", enabled=False))
    if torch.cuda.is_available():
        stack.enter_context(torch.autocast("cuda", enabled=False))
    return stack


def compare(
    spec: dict[str, Any], original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Run ``original`` and its patched twin on the same inputs (see the module doc)."""
    import torch

    patched = _patched_function(spec, original)
    owner = args[0] if args and isinstance(args[0], torch.nn.Module) else None
    was_training = owner.training if owner is not None else None

    def randomized(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return torch.randn_like(value)
        return value

    inputs = {
        "the script's own": (args, kwargs),
        "random": (
            tuple(randomized(a) if a is not owner else a for a in args),
            {k: randomized(v) for k, v in kwargs.items()},
        ),
    }
    worst, tolerance, runs, calls = 0.0, 0.0, [], 0
    try:
        # autocast off: what is compared is the function the code computes, in the module's own dtype
        with torch.no_grad(), _autocast_off(), _DropoutOff() as off:
            for training in (True, False) if owner is not None else (None,):
                if owner is not None:
                    owner.train(bool(training))
                for label, (a, k) in inputs.items():
                    before = off.sdpa_calls
                    want = _tensors(original(*a, **k))
                    if off.sdpa_calls != before:
                        raise RuntimeError(
                            f"the original {spec['qualname']} already calls scaled_dot_product_attention"
                        )
                    got = _tensors(patched(*a, **k))
                    calls += off.sdpa_calls - before
                    if len(want) != len(got) or not want:
                        raise RuntimeError("the two versions return different structures")
                    for w, g in zip(want, got, strict=True):
                        if w.shape != g.shape:
                            raise RuntimeError(f"output shapes differ: {tuple(w.shape)} and {tuple(g.shape)}")
                        tol = TOLERANCE.get(str(w.dtype).replace("torch.", ""), 1e-5)
                        tolerance = max(tolerance, tol)
                        if w.is_floating_point():
                            diff = (w.double() - g.double()).abs().nan_to_num(nan=float("inf"))
                            both_nan = w.isnan() & g.isnan()
                            diff = diff.masked_fill(both_nan, 0.0)
                            worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
                            ok = bool(torch.allclose(w, g, rtol=tol, atol=tol, equal_nan=True))
                        else:
                            ok = bool(torch.equal(w, g))
                        if not ok:
                            runs.append(f"{label} input, {'train' if training else 'eval'} mode")
    finally:
        if owner is not None and was_training is not None:
            owner.train(was_training)
    return {
        "max_abs_diff": worst,
        "tolerance": tolerance,
        "modes": ["train", "eval"] if owner is not None else ["-"],
        "differs": runs,
        "sdpa_calls": calls,
        "ok": not runs and calls > 0,
        **({} if calls else {"error": "the patched function never called scaled_dot_product_attention"}),
    }


def _function_of(frame: Any) -> Any:
    """The function object running in ``frame`` (a method found on its first argument's class)."""
    code = frame.f_code
    first = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
    for klass in type(first).__mro__ if first is not None else ():
        for value in vars(klass).values():
            if getattr(value, "__code__", None) is code:
                return value
    value = frame.f_globals.get(code.co_name)
    return value if getattr(value, "__code__", None) is code else None


def _arguments(frame: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    code = frame.f_code
    names = code.co_varnames
    loc = frame.f_locals
    n = code.co_argcount
    args = [loc[name] for name in names[:n]]
    kwargs = {name: loc[name] for name in names[n : n + code.co_kwonlyargcount]}
    at = n + code.co_kwonlyargcount
    if code.co_flags & 0x04:  # *args
        args.extend(loc[names[at]])
        at += 1
    if code.co_flags & 0x08:  # **kwargs
        kwargs.update(loc[names[at]])
    return tuple(args), kwargs


def main(argv: list[str]) -> None:
    """Check the functions SPEC names while SCRIPT runs (see the module doc)."""
    spec_path, out, script, *script_args = argv
    with open(spec_path, encoding="utf-8") as f:
        specs: list[dict[str, Any]] = json.load(f)
    wanted = {(os.path.realpath(s["file"]), int(s["first_line"])): s for s in specs}
    results: dict[str, dict[str, Any]] = {}
    seen: dict[int, Any] = {}
    written = False

    def write() -> None:
        nonlocal written
        if written:
            return
        written = True
        for s in specs:
            results.setdefault(s["qualname"], {"ok": False, "error": "the script never called it"})
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f)

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        key = seen.get(id(code))
        if key is None:
            key = seen[id(code)] = wanted.get(
                (os.path.realpath(code.co_filename), code.co_firstlineno), False
            )
        if not key or key["qualname"] in results:
            return
        spec = key
        try:
            function = _function_of(frame)
            if function is None:
                raise RuntimeError("the function object could not be found from its call")
            args, kwargs = _arguments(frame)
            results[spec["qualname"]] = compare(spec, function, args, kwargs)
        except Exception as exc:  # the script is not ours: any failure is a reason, not a crash
            results[spec["qualname"]] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        if len(results) == len(specs):
            sys.setprofile(None)
            write()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    import torch  # noqa: F401 - imported before the hook, so that torch's own import is not profiled

    atexit.register(write)
    sys.argv = [script, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    sys.setprofile(hook)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.setprofile(None)


if __name__ == "__main__":
    main(sys.argv[1:])

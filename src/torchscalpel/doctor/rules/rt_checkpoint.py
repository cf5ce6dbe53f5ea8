"""Runtime checkpoint and reproducibility rules: whole-module saves, unsafe loads, prefix mismatches, no seed."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules import checkpoint_static, loop_static
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr

_PREFIXES = ("module.", "_orig_mod.")


STATE_DICT_PREFIX_MISMATCH = RuleInfo(
    slug="state-dict-prefix-mismatch",
    severity=Severity.ERROR,
    category="checkpoint",
    summary="state_dict keys differ by a module./_orig_mod. prefix",
    kinds=("runtime",),
)


class CheckpointRules(RuntimeRule):
    """torch.save of modules, torch.load(weights_only=False), load_state_dict with prefixed keys."""

    infos = (
        checkpoint_static.WHOLE_MODEL_SAVE,
        checkpoint_static.UNSAFE_TORCH_LOAD,
        STATE_DICT_PREFIX_MISMATCH,
    )

    def __init__(self) -> None:
        super().__init__()
        self.saves: list[tuple[str, Location | None]] = []
        self.loads: list[tuple[Location | None, dict[str, Any]]] = []
        self.mismatch: dict[str, Any] | None = None

    def setup(self) -> Undo:
        rule = self

        def on_save(obj: Any) -> None:
            mods = []
            if isinstance(obj, torch.nn.Module):
                mods.append(type(obj).__name__)
            else:  # a module anywhere in a (nested) checkpoint dict/list: {"state": {"model": model}}
                stack: list[tuple[str, Any, int]] = [("", obj, 0)]
                while stack and len(mods) < 4:
                    key, o, depth = stack.pop()
                    if isinstance(o, torch.nn.Module):
                        mods.append(f"{key}: {type(o).__name__}")
                    elif depth < 3 and isinstance(o, dict):
                        stack.extend(
                            (f"{key}.{k}".lstrip("."), v, depth + 1) for k, v in list(o.items())[:64]
                        )
                    elif depth < 3 and isinstance(o, list | tuple):
                        stack.extend((f"{key}[{i}]", v, depth + 1) for i, v in enumerate(o[:64]))
            if mods:
                rule.saves.append((", ".join(mods), user_location()))

        def on_load(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
            if kwargs.get("weights_only") is False:
                f = args[0] if args else kwargs.get("f")
                rule.loads.append((user_location(), describe_loaded(result, f)))

        def on_load_state_dict(module: torch.nn.Module, state_dict: Any) -> None:
            if rule.mismatch is not None or not hasattr(state_dict, "keys"):
                return
            mine, theirs = set(module.state_dict().keys()), set(state_dict.keys())
            if mine == theirs or not theirs:
                return
            for prefix in _PREFIXES:
                strip = {k[len(prefix) :] if k.startswith(prefix) else k for k in theirs}
                add = {prefix + k for k in theirs}
                if strip == mine or (
                    len(strip & mine) > len(theirs & mine) and len(strip & mine) >= 0.9 * len(mine)
                ):
                    rule.mismatch = {
                        "prefix": prefix,
                        "direction": "strip",
                        "example": next(k for k in theirs if k.startswith(prefix)),
                        "model": type(module).__name__,
                        "location": user_location(),
                    }
                    return
                if add == mine or (
                    len(add & mine) > len(theirs & mine) and len(add & mine) >= 0.9 * len(mine)
                ):
                    rule.mismatch = {
                        "prefix": prefix,
                        "direction": "add",
                        "example": next(iter(sorted(theirs))),
                        "model": type(module).__name__,
                        "location": user_location(),
                    }
                    return

        safe_save, safe_load, safe_lsd = self.safe(on_save), self.safe(on_load), self.safe(on_load_state_dict)

        def make_save(original: Callable[..., Any]) -> Callable[..., Any]:
            def save(obj: Any, *args: Any, **kwargs: Any) -> Any:
                safe_save(obj)
                return original(obj, *args, **kwargs)

            return save

        def make_load(original: Callable[..., Any]) -> Callable[..., Any]:
            def load(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                safe_load(args, kwargs, result)
                return result

            return load

        def make_lsd(original: Callable[..., Any]) -> Callable[..., Any]:
            def load_state_dict(module: torch.nn.Module, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
                safe_lsd(module, state_dict)
                return original(module, state_dict, *args, **kwargs)

            return load_state_dict

        return undo_all(
            [
                wrap_attr(torch, "save", make_save),
                wrap_attr(torch, "load", make_load),
                wrap_attr(torch.nn.Module, "load_state_dict", make_lsd),
            ]
        )

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.saves:
            what, loc = self.saves[0]
            yield checkpoint_static.WHOLE_MODEL_SAVE.finding(
                f"torch.save pickles a whole module ({what}): loading it needs the same class at the same import "
                "path and weights_only=False, which runs arbitrary code.",
                evidence=[f"{len(self.saves)} save(s) of nn.Module objects, first at {fmt_loc(loc)}"],
                fix="torch.save(model.state_dict(), path)\nmodel.load_state_dict(torch.load(path, weights_only=True))",
                location=loc,
            )
        if self.loads:
            loc, load = self.loads[0]
            yield checkpoint_static.UNSAFE_TORCH_LOAD.finding(
                "torch.load(weights_only=False) unpickles arbitrary objects: a tampered checkpoint runs code here. "
                + load["advice"],
                evidence=[
                    f"{len(self.loads)} call(s), first at {fmt_loc(loc)}",
                    f"the file held {load['held']}",
                ],
                fix=load["fix"],
                location=loc,
            )
        if self.mismatch:
            m = self.mismatch
            p = m["prefix"]
            if m["direction"] == "strip":
                mapping = f"'{m['example']}' -> '{m['example'][len(p) :]}'"
                fix = f"state = {{k.removeprefix({p!r}): v for k, v in state.items()}}\nmodel.load_state_dict(state)"
                cause = "saved from a wrapped model (DDP's module. / torch.compile's _orig_mod.)"
            else:
                mapping = f"'{m['example']}' -> '{p}{m['example']}'"
                fix = f"state = {{{p!r} + k: v for k, v in state.items()}}\nwrapped.load_state_dict(state)\n# or load into the unwrapped model: model.module / model._orig_mod"
                cause = "loaded into a wrapped model"
            yield STATE_DICT_PREFIX_MISMATCH.finding(
                f"The state_dict keys differ from {m['model']}'s by a {p!r} prefix ({cause}): a strict load fails, "
                "a non-strict one silently loads nothing.",
                evidence=[f"key mapping: {mapping}"]
                + (
                    [f"the script failed with: {record.error}"] if record is not None and record.error else []
                ),
                fix=fix,
                location=m["location"],
            )


def _kinds(obj: Any, limit: int = 2000) -> dict[str, Any]:
    """What a loaded object is made of: tensors, numpy arrays, modules, other classes (bounded walk)."""
    found: dict[str, Any] = {"tensor": False, "numpy": False, "module": [], "other": set(), "plain": False}
    stack, seen = [obj], 0
    while stack and seen < limit:
        o = stack.pop()
        seen += 1
        if isinstance(o, torch.Tensor):
            found["tensor"] = True
        elif isinstance(o, torch.nn.Module):
            found["module"].append(type(o).__name__)
        elif type(o).__module__.startswith("numpy"):
            found["numpy"] = True
        elif isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list | tuple | set | frozenset):
            stack.extend(o)
        elif o is None or isinstance(o, str | bytes | int | float | bool | complex):
            found["plain"] = True
        else:
            found["other"].add(f"{type(o).__module__}.{type(o).__qualname__}")
    return found


def describe_loaded(obj: Any, f: Any) -> dict[str, str]:
    """What a ``torch.load(weights_only=False)`` returned, and the safe way to load exactly that:
    ``held`` (evidence), ``advice`` (one sentence) and ``fix`` (code). The globals a weights-only load
    would refuse come from torch itself (``get_unsafe_globals_in_checkpoint``) when the file is a path."""
    kinds = _kinds(obj)
    needed: list[str] | None = None
    if isinstance(f, str | os.PathLike) and os.path.isfile(f):
        try:
            needed = list(torch.serialization.get_unsafe_globals_in_checkpoint(f))
        except Exception:  # an old-format or odd file: judge by the loaded object alone
            needed = None
    parts = [
        name
        for name, on in (
            ("tensors", kinds["tensor"]),
            ("numpy arrays", kinds["numpy"]),
            ("plain Python data", kinds["plain"]),
        )
        if on
    ]
    parts += [f"module {m}" for m in kinds["module"][:2]] + sorted(kinds["other"])[:3]
    held = ", ".join(parts) or type(obj).__name__
    if needed is not None:
        held += f"; globals a weights-only load refuses: {', '.join(needed[:6]) or 'none'}"
    if kinds["module"]:
        return {
            "held": held,
            "advice": "It holds a whole module: save its state_dict instead.",
            "fix": "torch.save(model.state_dict(), path)\n"
            "model.load_state_dict(torch.load(path, weights_only=True, map_location='cpu'))",
        }
    if kinds["numpy"]:
        names = (
            ", ".join(needed) if needed else "numpy.ndarray, numpy.dtype, numpy._core.multiarray._reconstruct"
        )
        return {
            "held": held,
            "advice": "It holds numpy arrays, which weights_only=True refuses: store them with numpy "
            "(no pickle), or allow exactly numpy's globals.",
            "fix": "np.save(path, array)              # arrays: no pickle involved\n"
            "array = np.load(path)             # allow_pickle=False is numpy's default\n"
            "# or keep torch.save and allow exactly these globals:\n"
            f"with torch.serialization.safe_globals([{names}]):\n"
            "    blob = torch.load(path, weights_only=True)",
        }
    if (needed is not None and needed) or kinds["other"]:
        names = ", ".join(needed or sorted(kinds["other"]))
        return {
            "held": held,
            "advice": "weights_only=True needs exactly the classes below allowed.",
            "fix": f"with torch.serialization.safe_globals([{names}]):\n"
            "    state = torch.load(path, weights_only=True, map_location='cpu')\n"
            "# or store those objects as plain data (dicts, lists, numbers, strings)",
        }
    if kinds["plain"] and not kinds["tensor"]:
        return {
            "held": held,
            "advice": "It holds plain data only: weights_only=True loads it as is (or store it as JSON).",
            "fix": "data = torch.load(path, weights_only=True)\n"
            "# plain data needs no pickle at all: json.dump(data, f) / json.load(f)",
        }
    return {
        "held": held,
        "advice": "It holds only tensors and plain containers: weights_only=True loads it as is.",
        "fix": "state = torch.load(path, weights_only=True, map_location='cpu')",
    }


_SEED_FUNCS = (
    (torch, "manual_seed"),
    (torch.random, "manual_seed"),
    (torch.cuda, "manual_seed"),
    (torch.cuda, "manual_seed_all"),
    (random, "seed"),
)


class UnseededRun(RuntimeRule):
    """No torch/random/numpy seed was set before training finished its steps."""

    info = loop_static.UNSEEDED_RUN
    supersedes_static = True

    def __init__(self) -> None:
        super().__init__()
        self.seeded = False
        self.steps = 0
        self.backwards = 0
        self.location: Location | None = None

    def setup(self) -> Undo:
        rule = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def seed(*args: Any, **kwargs: Any) -> Any:
                rule.seeded = True
                return original(*args, **kwargs)

            return seed

        undos = [wrap_attr(owner, name, make) for owner, name in _SEED_FUNCS]
        try:
            import numpy as np

            undos.append(wrap_attr(np.random, "seed", make))
        except ImportError:
            pass
        return undo_all(undos)

    def on_optimizer_step_post(self, optimizer: Any) -> None:
        self.steps += 1
        if self.steps == 1:
            self.location = user_location()

    def on_backward_pre(self, tensors: Any) -> None:
        # Scripts without an optimizer (hand-written SGD) train too: a backward is enough.
        self.backwards += 1
        if self.backwards == 1 and self.location is None:
            self.location = user_location()

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.seeded or (self.steps < 1 and self.backwards < 1):
            return
        before = ((getattr(record, "provenance", None) or {}).get("seeds") or {}).get("before_block") or {}
        if before.get("set"):  # an in-process block whose earlier code (a notebook cell) seeded torch
            return
        yield loop_static.UNSEEDED_RUN.finding(
            "No random seed was set (torch, random or numpy): initial weights and data order differ from run to "
            "run, so a regression cannot be told from noise.",
            evidence=[
                f"{self.steps} optimizer step(s) and {self.backwards} backward call(s) ran without a seeding call"
            ],
            fix="import random, numpy as np, torch\nrandom.seed(0); np.random.seed(0); torch.manual_seed(0)",
            location=self.location,
        )

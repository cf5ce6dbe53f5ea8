"""Runtime model rules: modules in plain containers, unregistered tensors, modules created in forward."""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

from torchscalpel.doctor.rules import model_static
from torchscalpel.doctor.rules._common import attribute_location, fmt_loc, user_class
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location

_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()).keys())


def _user_attrs(module: torch.nn.Module) -> Iterator[tuple[str, Any]]:
    """Instance attributes a user set (not nn.Module's own bookkeeping)."""
    for key, value in vars(module).items():
        if key not in _MODULE_INTERNALS:
            yield key, value


def _holds_state(module: torch.nn.Module) -> bool:
    """The module (or a submodule) has a parameter or a buffer: what registration would carry."""
    return next(module.parameters(), None) is not None or next(module.buffers(), None) is not None


class _OncePerRoot(RuntimeRule):
    """Scan each root module once, at its first forward call."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if root and module not in self._seen:
            self._seen.add(module)
            self.scan(module)

    def scan(self, root: torch.nn.Module) -> None:
        raise NotImplementedError


class ModuleInPlainContainer(_OncePerRoot):
    """Submodules stored in list/tuple/dict attributes and not registered anywhere in the model."""

    info = model_static.MODULE_IN_PLAIN_CONTAINER

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[dict[str, Any]] = []

    def scan(self, root: torch.nn.Module) -> None:
        registered = {id(m) for m in root.modules()}
        for name, m in root.named_modules():
            if not user_class(m):
                continue
            for attr, value in _user_attrs(m):
                items = (
                    list(value.values())
                    if isinstance(value, dict)
                    else list(value)
                    if isinstance(value, list | tuple)
                    else []
                )
                # a module with no parameter nor buffer (an activation, a loss) loses nothing in a plain list
                hidden = [
                    x
                    for x in items
                    if isinstance(x, torch.nn.Module) and id(x) not in registered and _holds_state(x)
                ]
                if not hidden:
                    continue
                n_params = sum(p.numel() for x in hidden for p in x.parameters())
                self.hits.append(
                    {
                        "owner": f"{type(m).__name__}{'.' + name if name else ''}",
                        "attr": attr,
                        "kind": type(value).__name__,
                        "count": len(hidden),
                        "types": sorted({type(x).__name__ for x in hidden}),
                        "params": n_params,
                        "registered": sum(p.numel() for p in root.parameters()),
                        "location": attribute_location(type(m), attr),
                    }
                )

    def findings(self, record: Any) -> Iterator[Finding]:
        for h in self.hits:
            wrapper = "nn.ModuleDict" if h["kind"] == "dict" else "nn.ModuleList"
            yield model_static.MODULE_IN_PLAIN_CONTAINER.finding(
                f"{h['owner']}.{h['attr']} is a plain {h['kind']} of {h['count']} module(s) "
                f"({', '.join(h['types'])}) that the model does not register: the optimizer, .to(), "
                "state_dict() and DDP never see their parameters.",
                evidence=[
                    f"{h['params']:,} parameter elements in {h['owner']}.{h['attr']} are missing from "
                    f"model.parameters() ({h['registered']:,} registered)",
                    f"defined at {fmt_loc(h['location'])}",
                ],
                fix=f"self.{h['attr']} = {wrapper}(...)  # registers every module it holds",
                location=h["location"],
            )


class TensorAttributeNotRegistered(_OncePerRoot):
    """Plain tensor attributes on user modules (neither parameter nor buffer)."""

    info = model_static.TENSOR_ATTRIBUTE_NOT_REGISTERED

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[dict[str, Any]] = []

    def scan(self, root: torch.nn.Module) -> None:
        param = next(root.parameters(), None)
        model_device = str(param.device) if param is not None else None
        for name, m in root.named_modules():
            if not user_class(m):
                continue
            for attr, value in _user_attrs(m):
                if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                    self.hits.append(
                        {
                            "owner": f"{type(m).__name__}{'.' + name if name else ''}",
                            "attr": attr,
                            "shape": list(value.shape),
                            "device": str(value.device),
                            "model_device": model_device,
                            "location": attribute_location(type(m), attr),
                        }
                    )

    def findings(self, record: Any) -> Iterator[Finding]:
        crashed_on_device = bool(
            record is not None and record.error and "device" in (record.error or "").lower()
        )
        for h in self.hits:
            evidence = [
                f"{h['owner']}.{h['attr']}: tensor of shape {h['shape']} on {h['device']}, "
                f"not in named_parameters() or named_buffers()",
            ]
            if h["model_device"] and h["model_device"] != h["device"]:
                evidence.append(
                    f"the model's parameters are on {h['model_device']}: a device mismatch in forward"
                )
            if crashed_on_device:
                evidence.append(f"the script failed with: {record.error}")
            yield model_static.TENSOR_ATTRIBUTE_NOT_REGISTERED.finding(
                f"{h['owner']}.{h['attr']} is a plain tensor attribute: model.to(device) leaves it behind and "
                "state_dict() does not save it.",
                evidence=[*evidence, f"defined at {fmt_loc(h['location'])}"],
                fix=f"self.register_buffer({h['attr']!r}, tensor)  # or nn.Parameter(tensor) if it is learned",
                location=h["location"],
            )


class ModuleCreatedInForward(RuntimeRule):
    """New modules with parameters, not registered in the calling model, appearing call after call."""

    info = model_static.MODULE_CREATED_IN_FORWARD

    def __init__(self) -> None:
        super().__init__()
        self._registered: set[int] = set()
        self._root_calls = 0
        self._seen: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.new_per_call: Counter[int] = Counter()
        self.types: Counter[str] = Counter()
        self.locations: Counter[tuple[str, int]] = Counter()

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if root:
            self._root_calls += 1
            self._registered = {id(m) for m in module.modules()}
            return
        if id(module) in self._registered or module in self._seen:
            return
        self._seen.add(module)
        if next(module.parameters(), None) is None:
            return
        if self._root_calls >= 2:  # new modules keep appearing after the first call: built in forward
            self.new_per_call[self._root_calls] += 1
            self.types[type(module).__name__] += 1
            loc = user_location()
            if loc is not None:
                self.locations[(loc.file, loc.line)] += 1

    def findings(self, record: Any) -> Iterator[Finding]:
        if len(self.new_per_call) < 2:
            return
        loc = None
        if self.locations:
            (file, line), _ = self.locations.most_common(1)[0]
            loc = Location(file=file, line=line)
        types = ", ".join(f"{n}x {t}" for t, n in self.types.most_common(4))
        yield model_static.MODULE_CREATED_IN_FORWARD.finding(
            "Modules with parameters are constructed during forward: each call gets fresh random weights "
            "that are never trained and never reach the optimizer.",
            evidence=[
                f"{sum(self.new_per_call.values())} new unregistered modules ({types}) appeared in "
                f"{len(self.new_per_call)} of {self._root_calls} model calls",
                f"called at {fmt_loc(loc)}",
            ],
            fix="# in __init__:\nself.proj = nn.Linear(d_in, d_out)\n# in forward:\nx = self.proj(x)",
            location=loc,
        )

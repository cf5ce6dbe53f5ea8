"""What every knob shares: the knob interface, the apply log, and root-module hooks.

A knob applies itself to an unmodified script as a *setup hook*: a callable run before the
script that patches a PyTorch entry point (``DataLoader.__init__``, an optimizer's ``__init__``,
a global module hook, a backend flag) and returns an *undo* callable that restores it. Knobs never
edit source; they only change defaults and wrap calls, so the same script runs with and without
them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts
    from torchscalpel.tune.settings import TuneSettings

Undo = Callable[[], None]
SetupHook = Callable[[], Undo]

# Numerics classes, loosest last. The gate's tolerance for a combination is its loosest member's.
EXACT = "exact"
"""Same arithmetic, possibly a different summation order (threads, data loading)."""
CLOSE = "close"
"""Reordered or fused float32 arithmetic (compile, fused optimizers, reduced matmul precision)."""
LOW_PRECISION = "bf16"
"""Half-precision arithmetic (autocast)."""
NUMERICS_ORDER = (EXACT, CLOSE, LOW_PRECISION)


@dataclass(slots=True)
class ApplyLog:
    """What the knobs of one run did, and what they could not do (with the reason)."""

    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    fired: set[str] = field(default_factory=set)

    def did(self, knob: str, what: str) -> None:
        """Record that ``knob`` changed something (first few messages kept)."""
        self.fired.add(knob)
        if what not in self.applied and len(self.applied) < 50:
            self.applied.append(what)

    def skip(self, knob: str, reason: str) -> None:
        """Record that ``knob`` could not apply, and why."""
        message = f"{knob}: {reason}"
        if message not in self.skipped:
            self.skipped.append(message)

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the trial record."""
        return {"applied": list(self.applied), "skipped": list(self.skipped), "fired": sorted(self.fired)}


class Knob:
    """One family of settings. Subclasses set ``name``/``numerics`` and implement the methods."""

    name: str = "knob"
    """Family name, as typed in ``--knobs`` (e.g. ``amp``, ``compile``, ``dataloader``)."""
    numerics: str = EXACT
    """Numerics class of this knob (see :data:`NUMERICS_ORDER`)."""
    description: str = ""
    addresses: tuple[str, ...] = ()
    """Bottleneck classes (``launch``, ``compute``, ``data``, ``optimizer``, ``memory``) this knob
    addresses beyond :data:`torchscalpel.tune.plan.FAMILIES`: a new knob declares them here and
    the planner tries it first when the baseline's profile shows that class."""

    def is_set(self, settings: TuneSettings) -> bool:
        """True when ``settings`` asks this knob to do something."""
        raise NotImplementedError

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        """Settings worth trying on a model with these facts, or ``([], reason)`` when it cannot apply."""
        raise NotImplementedError

    def skipped_candidates(self, facts: ModelFacts) -> list[tuple[str, str]]:
        """Trials this knob would run on another model but not on this one: (label, reason) rows
        for the table, next to the candidates that do run. None by default."""
        return []

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        """The setup hook that applies this knob's part of ``settings`` (None when not set)."""
        raise NotImplementedError

    def code_lines(self, settings: TuneSettings) -> list[str]:
        """Equivalent lines for a user who prefers to edit the script."""
        raise NotImplementedError


def _noop() -> None:
    return None


class RootHooks:
    """Global forward hooks that call back on the *outermost* module call only (the model).

    Depth is counted across all modules; hooks skip while dynamo traces (a hook seen inside a
    compiled region would otherwise be traced into the graph), so compiled submodules keep the
    count balanced. Parameter-less roots (a loss module called on its own) are ignored.
    """

    def __init__(
        self,
        on_pre: Callable[[torch.nn.Module, tuple[Any, ...]], tuple[Any, ...] | None] | None = None,
        on_post: Callable[[torch.nn.Module, Any], Any] | None = None,
    ) -> None:
        self._on_pre = on_pre
        self._on_post = on_post
        self._depth = 0
        self._active: list[bool] = []
        self._handles: list[Any] = []

    def install(self) -> Undo:
        """Register the global hooks; the returned callable removes them."""
        from torch.nn.modules import module as mod

        self._handles = [
            # torch annotates the hook as returning None, but a returned tuple replaces the inputs (its docs)
            mod.register_module_forward_pre_hook(self._pre),  # type: ignore[arg-type]
            mod.register_module_forward_hook(self._post, always_call=True),
        ]

        def undo() -> None:
            for handle in self._handles:
                handle.remove()
            self._handles = []

        return undo

    def _pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if torch.compiler.is_compiling():
            return None
        is_root = self._depth == 0 and _has_parameters(module)
        self._depth += 1
        self._active.append(is_root)
        if is_root and self._on_pre is not None:
            return self._on_pre(module, args)
        return None

    def _post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if torch.compiler.is_compiling():
            return None
        if not self._active:  # hooks installed in the middle of a forward call
            return None
        self._depth = max(0, self._depth - 1)
        is_root = self._active.pop()
        if is_root and self._on_post is not None:
            return self._on_post(module, output)
        return None


def _has_parameters(module: torch.nn.Module) -> bool:
    return next(iter(module.parameters()), None) is not None


def module_device(module: torch.nn.Module) -> torch.device:
    """Device of the module's first parameter (CPU for a parameter-less module)."""
    param = next(iter(module.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in a (nested) tuple / list / dict output; other values pass through."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, tuple | list):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        try:
            return type(value)((k, map_tensors(v, fn)) for k, v in value.items())
        except TypeError:  # dict subclasses with custom constructors (e.g. ModelOutput)
            for k, v in value.items():
                value[k] = map_tensors(v, fn)
            return value
    return value

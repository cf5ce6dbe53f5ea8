"""Runtime rules: observers of the live run, each isolated so that a crashing rule reports itself.

A :class:`RuntimeRule` is an :class:`~torchscalpel.runtime.observer.Observer` that may also patch
torch functions for the run (:meth:`RuntimeRule.setup`, undone afterwards) and turns what it saw
into findings in :meth:`RuntimeRule.findings`, each built from its own
:class:`~torchscalpel.doctor.rule.RuleInfo` (``INFO.finding(message, ...)``). Like every rule it declares its
:class:`~torchscalpel.doctor.rule.RuleInfo` on the class and is listed in
:mod:`torchscalpel.doctor.catalogue`. :class:`DoctorObserver` fans every runtime event out to the
rules that listen to it, through one generic forwarder per :class:`Observer` event (a new event
needs no edit here); an exception inside a rule disables that rule only and becomes its
internal-error finding, so the user's script and the other rules are never affected.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import torch

from torchscalpel.doctor.rule import Rule, guarded, internal_error
from torchscalpel.findings import Finding, Location
from torchscalpel.runtime.observer import Observer, listeners_by_event
from torchscalpel.runtime.patching import Undo
from torchscalpel.runtime.userframes import user_frame


def user_location(depth_limit: int = 60) -> Location | None:
    """The innermost stack frame in the user's code (:mod:`~torchscalpel.runtime.userframes`), None if none.

    No library fallback: a finding's location is where the user edits, and a finding without one is
    better than one pointing into Lightning. The depth limit bounds what a hook fired deep in a
    framework's stack pays on each call.
    """
    frame = user_frame(sys._getframe(1), max_depth=depth_limit)
    return None if frame is None else Location(file=frame.f_code.co_filename, line=frame.f_lineno)


class RuntimeRule(Rule, Observer):
    """Base class of runtime rules; ``info``/``infos`` declare the rules a class reports."""

    supersedes_static: bool = False
    """When True, a static finding of the same slug is dropped once this rule has watched a run."""

    def __init__(self) -> None:
        self.crashed: BaseException | None = None
        self.session: Any = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.slugs[0] if self.slugs else type(self).__name__

    def setup(self) -> Undo | None:
        """Patch what the rule needs before the script starts; return the undo callable."""
        return None

    def findings(self, record: Any) -> Iterable[Finding]:
        """What the rule concluded from the run."""
        return ()

    def safe(self, fn: Callable[..., Any]) -> Callable[..., None]:
        """Wrap a rule callback used inside a patch: errors disable the rule, never reach the script."""

        def call(*args: Any, **kwargs: Any) -> None:
            if self.crashed is not None:
                return
            try:
                fn(*args, **kwargs)
            except Exception as exc:
                self.crashed = exc

        return call


class DoctorObserver(Observer):
    """One observer that runs every runtime rule with crash isolation."""

    name = "doctor"

    def __init__(self, rules: Sequence[RuntimeRule]) -> None:
        self.rules = list(rules)
        self._undo: list[Undo] = []
        # Only the rules that override an event get it (most rules ignore the per-module forwards).
        self._listeners = listeners_by_event(self.rules)

    def _dispatch(self, event: str, *args: Any) -> None:
        for rule in self._listeners[event]:
            if rule.crashed is not None:
                continue
            try:
                getattr(rule, event)(*args)
            except Exception as exc:  # a broken rule must never break the user's run
                rule.crashed = exc

    def on_start(self, session: Any) -> None:
        for rule in self.rules:  # every rule may read the session, listening to on_start or not
            rule.session = session
        self._dispatch("on_start", session)

    def setup_hook(self) -> Undo:
        """For ``run_target(setup_hooks=[...])``: apply every rule's patches; returns the undo of all."""
        for rule in self.rules:
            try:
                undo = rule.setup()
            except Exception as exc:
                rule.crashed = exc
                continue
            if undo is not None:
                self._undo.append(undo)
        return self.undo

    def undo(self) -> None:
        """Remove every patch (last applied first)."""
        while self._undo:
            try:
                self._undo.pop()()
            except Exception:  # restoring is best effort; the process is ending a run anyway
                pass

    def findings(self, record: Any) -> list[Finding]:
        """Every rule's findings; a crashed rule gives one internal-error finding per slug it owns."""
        out: list[Finding] = []
        for rule in self.rules:
            if rule.crashed is not None:
                out.extend(internal_error(slug, rule.crashed) for slug in rule.slugs)
                continue
            found = guarded(rule.name, partial(rule.findings, record), source="runtime")
            out.extend(found)
        return out

    def superseded_static(self) -> set[str]:
        """Slugs whose static findings this run makes redundant."""
        return {s for r in self.rules if r.supersedes_static and r.crashed is None for s in r.slugs}


OBSERVER_EVENTS: tuple[str, ...] = tuple(listeners_by_event(()))
"""Every ``on_*`` event of :class:`Observer` (the runtime's own list, so new events arrive here unedited)."""


def _forwarder(event: str) -> Callable[..., None]:
    def forward(self: DoctorObserver, *args: Any) -> None:
        self._dispatch(event, *args)

    forward.__name__ = forward.__qualname__ = event
    forward.__doc__ = getattr(Observer, event).__doc__
    return forward


# Real methods on the class (not instance attributes): the runtime sends an event only to observers
# whose class overrides it.
for _event in OBSERVER_EVENTS:
    if _event not in DoctorObserver.__dict__:
        setattr(DoctorObserver, _event, _forwarder(_event))
del _event


def iter_tensors(obj: Any, limit: int = 16) -> list[torch.Tensor]:
    """Tensors inside a forward output (tensor, tuple/list, dict, dataclass-like), at most ``limit``.

    Iterative on purpose: a recursive closure would form a reference cycle holding the tensors (and
    their autograd graphs) until the garbage collector runs.
    """
    found: list[torch.Tensor] = []
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack and len(found) < limit:
        o, depth = stack.pop()
        if isinstance(o, torch.Tensor):
            found.append(o)
        elif depth >= 4:
            continue
        elif isinstance(o, list | tuple):
            stack.extend((x, depth + 1) for x in reversed(o))
        elif isinstance(o, dict):
            stack.extend((x, depth + 1) for x in reversed(list(o.values())))
        elif hasattr(o, "__dataclass_fields__"):
            stack.extend((getattr(o, k, None), depth + 1) for k in reversed(list(o.__dataclass_fields__)))
    return found

"""Wrap a function attribute for one run and put it back, whatever order the undos come in.

The runtime (``Tensor.backward``, the DataLoader iterator), the doctor's rules, the inserted
GradScaler and the tracking observers all wrap torch functions for the length of a run, often the
same function (``clip_grad_norm_``, ``torch.manual_seed``) and not always undone in the reverse of
the order they were put on. Restoring "the original I saw" is then wrong: an undo that runs while
another wrapper sits on top would remove that wrapper's layer, and one that runs after the layer
below it was undone would put that dead layer back for good (seen: the doctor's seed wrappers
reinstated after a ``torchscalpel.doctor(...)`` block).

So every wrapper is one :func:`wrap_attr` layer with one rule:

- undoing a layer switches it off at once: from then on it passes calls straight to what it
  wrapped, even while another wrapper still holds it;
- if the layer is on top, the attribute is put back to the first layer below that is still on, or
  to the original (an attribute a class inherited is deleted again, not copied onto the class);
- if it is not on top, it stays in place switched off, and the layer above skips past it when
  that one is undone.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Undo = Callable[[], None]
"""Puts back what a patch replaced; safe to call more than once."""

_STATE = "__scalpel_patch__"


@dataclass
class _Layer:
    """One wrapper's bookkeeping: where it sits, what it replaced, whether it is still on."""

    owner: Any
    attr: str
    below: Any  # the callable this layer wraps (what ``getattr`` gave)
    owned: bool  # the attribute was in ``vars(owner)`` (not inherited) before this layer
    raw: Any  # ``vars(owner)[attr]`` as it was (a descriptor on a class), for the restore
    live: bool = True


def wrap_attr(
    owner: Any,
    attr: str,
    make: Callable[[Callable[..., Any]], Callable[..., Any]],
    *,
    observe_only: bool = False,
) -> Undo:
    """Replace ``owner.attr`` by ``make(original)`` for a while; the returned callable undoes it.

    ``make`` gets the current callable and returns the wrapper's behaviour; the installed object is
    a thin layer around it that follows the rules in the module docstring. Raises
    ``AttributeError`` when ``owner`` has no ``attr``.

    ``observe_only``: the wrapper only records (it never changes what the call computes), so while
    dynamo traces a compiled region the layer calls straight through to what it wrapped. Why: a
    recorder's closure holds what dynamo cannot trace (frames, weak references), and each call
    inside a compiled forward broke the graph (a transformers model builds a ``ModuleList`` slice in
    every forward: 8 breaks under the sites recorder's ``nn.Module.__init__``).
    """
    below = getattr(owner, attr)
    namespace = vars(owner)
    owned = attr in namespace
    layer_state = _Layer(owner, attr, below, owned, namespace[attr] if owned else None)
    inner = make(below)
    # The switch the layer reads is a plain bool in a closure cell, not ``layer_state.live``: dynamo
    # traces a layer that runs inside a compiled region (``nn.Module.__init__`` when a transformers
    # model slices its ``ModuleList`` in forward) and cannot build a ``_Layer`` there; it broke the
    # graph at every such call (8 breaks in a tiny Llama's forward).
    on = True
    compiling = _is_compiling if observe_only else _never

    def layer(*args: Any, **kwargs: Any) -> Any:
        if on and not compiling():
            return inner(*args, **kwargs)
        return below(*args, **kwargs)

    try:
        functools.update_wrapper(layer, below)
    except (AttributeError, TypeError):  # a builtin without some of the attributes
        pass
    # after update_wrapper: it copies the wrapped object's __dict__, which for a layer holds its own state
    setattr(layer, _STATE, layer_state)
    setattr(owner, attr, layer)

    def undo() -> None:
        nonlocal on
        if not layer_state.live:
            return
        layer_state.live = False
        on = False
        if vars(owner).get(attr) is layer:
            _put_back(layer_state)

    return undo


def _never() -> bool:
    return False


def _is_compiling() -> bool:
    """``torch.compiler.is_compiling()`` (False when torch is not imported: nothing compiles then)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.compiler.is_compiling())


def _put_back(state: _Layer) -> None:
    """Restore what ``state``'s layer replaced, skipping layers below it that were undone meanwhile."""
    below_state = getattr(state.below, _STATE, None)
    if (
        isinstance(below_state, _Layer)
        and not below_state.live
        and below_state.owner is state.owner
        and below_state.attr == state.attr
    ):
        _put_back(below_state)
        return
    if state.owned:
        setattr(state.owner, state.attr, state.raw)
    else:
        delattr(state.owner, state.attr)


def is_live_layer(fn: Any) -> bool:
    """Whether ``fn`` is a :func:`wrap_attr` layer that has not been undone."""
    state = getattr(fn, _STATE, None)
    return isinstance(state, _Layer) and state.live


def undo_all(undos: Sequence[Undo]) -> Undo:
    """One undo for several patches: undoes them last-patched first."""

    def undo() -> None:
        for one in reversed(undos):
            one()

    return undo


def replace_for_process(owner: Any, attr: str, replacement: Callable[..., Any]) -> None:
    """Set ``owner.attr`` to ``replacement`` for the rest of the process: never undone, no layer.

    Only for what a launched rank installs before the user's script starts and keeps until it exits
    (the collective log, the rank facts): nothing is restored, so :func:`wrap_attr`'s undo rules have
    nothing to do, and its layer would add a Python frame to every collective call and shift the frame
    depth the rank-facts wrappers read the caller's line from."""
    setattr(owner, attr, replacement)

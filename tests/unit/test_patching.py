"""runtime.patching: one wrap-and-restore rule for every torchscalpel wrapper, in any undo order."""

from __future__ import annotations

import types
from typing import Any

from torchscalpel.runtime.patching import is_live_layer, undo_all, wrap_attr


def _owner() -> types.SimpleNamespace:
    def original(x: int) -> int:
        return x

    return types.SimpleNamespace(fn=original)


def _tag(calls: list[str], name: str) -> Any:
    def make(below: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return below(*args, **kwargs)

        return wrapper

    return make


def test_undo_in_reverse_order_restores_the_original() -> None:
    owner, calls = _owner(), []
    original = owner.fn
    undo_a = wrap_attr(owner, "fn", _tag(calls, "a"))
    undo_b = wrap_attr(owner, "fn", _tag(calls, "b"))
    assert owner.fn(3) == 3 and calls == ["b", "a"]
    undo_b()
    undo_a()
    assert owner.fn is original


def test_undo_below_first_then_top_restores_the_original_not_the_dead_layer() -> None:
    # the bug this module exists for: the lower wrapper undone first, then the upper one put back
    # "what it saw", which was the lower wrapper, for good
    owner, calls = _owner(), []
    original = owner.fn
    undo_low = wrap_attr(owner, "fn", _tag(calls, "low"))
    undo_high = wrap_attr(owner, "fn", _tag(calls, "high"))
    undo_low()
    owner.fn(1)
    assert calls == ["high"]  # the undone layer passes straight through while it is still held
    undo_high()
    assert owner.fn is original


def test_three_layers_middle_then_bottom_then_top() -> None:
    owner, calls = _owner(), []
    original = owner.fn
    undos = [wrap_attr(owner, "fn", _tag(calls, name)) for name in ("one", "two", "three")]
    undos[1]()
    undos[0]()
    owner.fn(0)
    assert calls == ["three"]
    undos[2]()
    assert owner.fn is original


def test_top_undone_while_a_lower_layer_is_live_leaves_that_layer() -> None:
    owner, calls = _owner(), []
    undo_low = wrap_attr(owner, "fn", _tag(calls, "low"))
    undo_high = wrap_attr(owner, "fn", _tag(calls, "high"))
    undo_high()
    assert is_live_layer(owner.fn)
    owner.fn(0)
    assert calls == ["low"]
    undo_low()
    assert not is_live_layer(owner.fn)


def test_a_foreign_wrapper_on_top_is_kept_and_ours_passes_through() -> None:
    owner, calls = _owner(), []
    undo = wrap_attr(owner, "fn", _tag(calls, "ours"))
    ours = owner.fn

    def foreign(x: int) -> int:
        calls.append("foreign")
        return ours(x)

    owner.fn = foreign
    undo()
    assert owner.fn is foreign  # not ours to remove
    assert owner.fn(5) == 5 and calls == ["foreign"]


def test_an_inherited_method_is_deleted_again_not_copied_onto_the_subclass() -> None:
    class Base:
        def step(self) -> str:
            return "base"

    class Child(Base):
        pass

    calls: list[str] = []
    undo = wrap_attr(Child, "step", _tag(calls, "wrapped"))
    assert "step" in vars(Child) and Child().step() == "base" and calls == ["wrapped"]
    undo()
    assert "step" not in vars(Child)
    assert Child().step() == "base"


def test_undo_twice_and_undo_all_order() -> None:
    owner, calls = _owner(), []
    original = owner.fn
    both = undo_all([wrap_attr(owner, "fn", _tag(calls, "a")), wrap_attr(owner, "fn", _tag(calls, "b"))])
    both()
    both()
    assert owner.fn is original


def test_the_layer_keeps_the_wrapped_functions_name_and_doc() -> None:
    import torch

    undo = wrap_attr(torch, "manual_seed", _tag([], "seed"))
    try:
        assert torch.manual_seed.__name__ == "manual_seed"
        assert torch.manual_seed.__doc__ and "seed" in torch.manual_seed.__doc__
    finally:
        undo()
    assert not is_live_layer(torch.manual_seed)


def test_an_observe_only_layer_calls_straight_through_while_dynamo_traces(monkeypatch):
    """A recorder on ``nn.Module.__init__`` (the sites recorder: frames, weak references) was traced into
    every compiled forward that builds a module (a transformers ModuleList slice) and broke the graph 8
    times in a tiny Llama; an observe_only layer passes straight to what it wrapped while compiling, and
    records as before outside it. A wrapper that changes results (not observe_only) still runs."""
    from torchscalpel.runtime import patching

    class Owner:
        def f(self, x: int) -> int:
            return x + 1

    calls: list[str] = []

    def recorder(original):
        def f(obj, x):
            calls.append("recorded")
            return original(obj, x)

        return f

    def changer(original):
        def f(obj, x):
            calls.append("changed")
            return original(obj, x) * 10

        return f

    compiling = [False]
    monkeypatch.setattr(patching, "_is_compiling", lambda: compiling[0])
    undo_rec = wrap_attr(Owner, "f", recorder, observe_only=True)
    undo_chg = wrap_attr(Owner, "f", changer)
    try:
        assert Owner().f(1) == 20 and calls == ["changed", "recorded"]
        calls.clear()
        compiling[0] = True
        assert Owner().f(1) == 20 and calls == ["changed"]  # the recorder is skipped, the change is not
    finally:
        undo_chg()
        undo_rec()
    assert Owner().f(1) == 2

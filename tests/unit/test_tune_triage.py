"""Compile triage in-process (aot_eager: about dynamo's behaviour, not generated code): fullgraph
attempted and reported, graph breaks with file:line, recompile guards, a failing function excluded
and retried once, and no recompile when the global hook tables change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchscalpel.tune import triage
from torchscalpel.tune.knobs import ApplyLog
from torchscalpel.tune.knobs.compile import compile_stats, install_compile, reset_compile_stats
from torchscalpel.tune.settings import CompileSpec

THIS = __file__


@torch._dynamo.register_backend
def fails_on_sin(gm, example_inputs):
    """A backend that cannot lower ``sin`` and names it, as inductor names the op it cannot lower."""
    for node in gm.graph.nodes:
        if node.target in (torch.sin, torch.ops.aten.sin.default):
            raise RuntimeError(f"cannot lower {node.name} (target {node.target})")
    return gm.forward


def wobble(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


class Breaks(Plain):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.sum().item() > -1e9:  # data-dependent branch: a graph break here
            y = y + 1
        return y.relu()


class CallsWobble(Plain):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return wobble(self.lin(x)).relu()


X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


def run(model: nn.Module, spec: CompileSpec, calls: int = 2) -> tuple[ApplyLog, list[torch.Tensor], dict]:
    reset_compile_stats()
    log = ApplyLog()
    undo = install_compile(spec, log)
    try:
        outs = [model(X) for _ in range(calls)]
    finally:
        undo()
    return log, outs, compile_stats()


def test_a_region_without_breaks_compiles_fullgraph_and_says_so():
    _, _, stats = run(Plain(), CompileSpec(target="model", backend="aot_eager"))
    assert stats["fullgraph"] == {"attempted": True, "ok": True}
    assert stats["breaks"] == [] and stats["graphs"] >= 1


def test_a_graph_break_is_reported_with_file_line_and_the_region_still_compiles():
    model = Breaks()
    expected = model(X)
    _, outs, stats = run(model, CompileSpec(target="model", backend="aot_eager"))
    assert torch.allclose(outs[0], expected)
    full = stats["fullgraph"]
    assert full["attempted"] and not full["ok"] and full["where"].startswith(f"{THIS}:")
    assert stats["breaks"], stats
    assert any(b["where"].startswith(f"{THIS}:") and b["reason"] for b in stats["breaks"])


def test_a_compile_failure_excludes_the_failing_function_and_retries_once(monkeypatch):
    monkeypatch.setitem(globals(), "wobble", wobble)  # restored after the test (the knob wraps it)
    model = CallsWobble()
    expected = model(X)
    log, outs, stats = run(model, CompileSpec(target="model", backend="fails_on_sin", fullgraph=False))
    assert torch.allclose(outs[0], expected) and torch.allclose(outs[1], expected)
    (excluded,) = stats["excluded"]
    assert excluded["function"] == "wobble" and excluded["where"].startswith(f"{THIS}:")
    assert "cannot lower sin" in excluded["cause"] and excluded["retried"] == "yes"
    assert any("excluded with torch.compiler.disable and retried" in a for a in log.applied)


def test_a_second_failure_is_not_retried_again():
    class AlwaysFails(Plain):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sin(self.lin(x))  # in the region's own forward: excluding it changes nothing

    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="cannot lower sin"):
        run(AlwaysFails(), CompileSpec(target="model", backend="fails_on_sin", fullgraph=False))
    assert len(compile_stats()["excluded"]) == 1  # one retry, then the failure is the trial's


def test_changing_global_hooks_does_not_recompile_a_region():
    model = Plain()
    reset_compile_stats()
    log = ApplyLog()
    undo = install_compile(CompileSpec(target="lin", backend="aot_eager"), log)
    handle = None
    try:
        x = torch.randn(3, 4)
        model(x)
        # what the runtime does after warm-up: its global hooks go, root hooks come
        handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
        model(x)
        model(x)
    finally:
        if handle is not None:
            handle.remove()
        undo()
    stats = compile_stats()
    assert stats["recompiles"] == 0 and stats["recompile_guards"] == [], stats


def test_recompiles_are_reported_with_the_guard_and_where():
    model = Plain()
    reset_compile_stats()
    undo = install_compile(CompileSpec(target="model", backend="aot_eager", dynamic=False), ApplyLog())
    try:
        model(torch.randn(3, 4))
        model(torch.randn(5, 4))  # new batch sizes with dynamic=False: recompiles on the size guard
        model(torch.randn(7, 4))
    finally:
        undo()
    stats = compile_stats()
    assert stats["recompiles"] >= 1
    guard = stats["recompile_guards"][0]
    assert guard["where"].startswith(f"{THIS}:") and "size" in guard["guard"], guard


def test_user_frames_skip_library_code():
    trace = (
        'File "/usr/lib/python3/site-packages/torch/nn/modules/module.py", line 1, in _call_impl\n'
        'File "/home/u/train.py", line 7, in forward\nFile "/home/u/train.py", line 3, in helper\n'
    )
    assert triage.user_frames(trace) == [
        ("/home/u/train.py", 7, "forward"),
        ("/home/u/train.py", 3, "helper"),
    ]


def test_a_model_with_compiled_regions_can_still_be_deep_copied():
    import copy

    model = Plain()
    reset_compile_stats()
    undo = install_compile(CompileSpec(target="lin", backend="aot_eager"), ApplyLog())
    try:
        model(X)
        clone = copy.deepcopy(model)
        assert torch.allclose(clone(X), model(X))
    finally:
        undo()


GRAPH_RUNS: list[int] = []
GRAPHS: list[torch.fx.GraphModule] = []


@torch._dynamo.register_backend
def counts_graph_runs(gm, example_inputs):
    """A backend whose compiled code counts its own executions (dynamo's counters count compiles)."""
    GRAPHS.append(gm)

    def run(*args):
        GRAPH_RUNS.append(1)
        return gm.forward(*args)

    return run


def _train_compiled(steps: int, block) -> ApplyLog:
    model = Plain()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    log = ApplyLog()
    torch._dynamo.reset()
    reset_compile_stats()
    undo = install_compile(CompileSpec(target="model", backend="counts_graph_runs"), log)
    try:
        with block:
            for _ in range(steps):
                loss = model(X).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
    finally:
        undo()
    return log


def test_under_the_runtime_every_forward_runs_the_compiled_graph_with_no_hook_of_ours_inside(tmp_path):
    """The runtime's hooks (global in warm-up, root hooks after) and its Tensor.backward wrapper sit
    around a compiled region; the region's compiled code must still run on every call as in a plain
    loop, as one graph that holds no torchscalpel code (issue 16: compile lost inside the tune
    runtime on a CPU)."""
    import contextlib

    import torchscalpel

    steps = 6
    GRAPH_RUNS.clear()
    GRAPHS.clear()
    _train_compiled(steps, contextlib.nullcontext())
    plain_runs = len(GRAPH_RUNS)
    assert plain_runs >= steps - 1  # dynamo runs the first call's frame itself

    GRAPH_RUNS.clear()
    GRAPHS.clear()
    run = torchscalpel.profile(steps=None, warmup=2, profile_steps=0, out=tmp_path / "r", report=False)
    log = _train_compiled(steps, run)
    assert len(GRAPH_RUNS) == plain_runs, (len(GRAPH_RUNS), plain_runs, log)
    assert len(GRAPHS) == 1 and compile_stats()["recompiles"] == 0
    targets = [n.target for gm in GRAPHS for n in gm.graph.nodes if n.op == "call_function"]
    assert not [t for t in targets if "torchscalpel" in (getattr(t, "__module__", "") or "")], targets
    # the runtime still saw the steps around the compiled call
    assert run.record is not None and len(run.record.steps) >= steps - 1

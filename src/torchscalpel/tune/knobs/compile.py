"""torch.compile knob: compile a region of the model, hottest region first.

Regions, in the order the search tries them: the repeated blocks (every instance of the block
class of :mod:`torchscalpel.blocks`, e.g. ``Block``, and only when the baseline's forward called
it: the regional compile recipe, one compiled graph reused by all instances), the hottest
top-level submodule by measured forward time, then the whole model. The first time
the model is called, each matching module's ``forward`` is replaced by its compiled version
(an instance attribute, so undo simply deletes it); module hooks keep running outside the graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.tune.knobs.base import CLOSE, ApplyLog, Knob, RootHooks, SetupHook, Undo
from torchscalpel.tune.settings import CompileSpec, TuneSettings

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts


HOT_SHARE = 0.25
"""A submodule is a compile region of its own when it takes at least this share of the forward."""


class CompileKnob(Knob):
    """torch.compile of the hottest submodule, the repeated blocks, or the whole model."""

    name = "compile"
    numerics = CLOSE
    description = "torch.compile of a model region"

    def __init__(self, *, backend: str = "inductor", modes: tuple[str, ...] = ("default",),
                 max_regions: int = 2) -> None:
        self.backend = backend
        self.modes = modes
        self.max_regions = max_regions

    def is_set(self, settings: TuneSettings) -> bool:
        return settings.compile is not None

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        if not facts.models:
            return [], "no model forward call was seen"
        dynamic = True if facts.input_shapes_vary else None
        targets = region_targets(facts, self.max_regions)
        out = []
        for target in targets:
            for mode in self.modes:
                out.append(TuneSettings(compile=CompileSpec(target=target, mode=mode, dynamic=dynamic,
                                                            backend=self.backend)))
        return out, None

    def skipped_candidates(self, facts: ModelFacts) -> list[tuple[str, str]]:
        # The block region is tried only on a block the baseline's forward called: compiling a
        # class that never runs (a ModuleDict container, say) is a no-op whose "speedup" is drift.
        if not facts.models or facts.repeated:
            return []
        if facts.uncalled_blocks:
            names = ", ".join(facts.uncalled_blocks)
            return [("compile(blocks)", f"the repeated block class {names} is never called in the forward")]
        return [("compile(blocks)", "no repeated block: no module class is called from a "
                                    "ModuleList/Sequential stack of two or more")]

    def setup_hook(self, settings: TuneSettings, log: ApplyLog) -> SetupHook | None:
        if settings.compile is None:
            return None
        spec = settings.compile
        # Inductor's parallel compile pool deadlocks in forked DataLoader workers on a cold cache.
        single_thread = bool(settings.dataloader.num_workers)
        return lambda: install_compile(spec, log, single_thread_compile=single_thread)

    def code_lines(self, settings: TuneSettings) -> list[str]:
        spec = settings.compile
        if spec is None:
            return []
        kwargs = []
        if spec.mode != "default":
            kwargs.append(f'mode="{spec.mode}"')
        if spec.dynamic is not None:
            kwargs.append(f"dynamic={spec.dynamic}")
        if spec.backend != "inductor":
            kwargs.append(f'backend="{spec.backend}"')
        args = ", ".join(kwargs)
        if spec.target == "model":
            return [f"model.compile({args})"]
        if "." in spec.target or spec.target[:1].islower():
            return [f'model.get_submodule("{spec.target}").compile({args})']
        return [
            "for module in model.modules():",
            f"    if type(module).__name__ == \"{spec.target}\":",
            f"        module.compile({args})",
        ]


def region_targets(facts: ModelFacts, limit: int) -> list[str]:
    """Compile targets in trial order: repeated blocks, hottest submodule, then the whole model.

    ``limit`` counts the whole model, which is always tried last.
    """
    containers = ("ModuleList", "ModuleDict", "Sequential")
    regions: list[str] = [r["cls"] for r in facts.repeated[:1]]
    # The hottest single submodule is worth its own trial only when it holds a real share of the
    # forward time (compiling a 3% embedding gains nothing measurable).
    timed = [s for s in facts.submodules if s.get("forward_ms") is not None
             and s["cls"] not in containers and s["cls"] not in regions]
    if timed:
        hottest = max(timed, key=lambda s: s["forward_ms"])
        if facts.forward_ms and hottest["forward_ms"] >= HOT_SHARE * facts.forward_ms:
            regions.append(hottest["name"])
    return [*regions[: max(0, limit - 1)], "model"]


def matching_modules(model: torch.nn.Module, target: str) -> list[torch.nn.Module]:
    """The modules ``target`` names: the model, a submodule by qualified name, or every instance of a class."""
    if target == "model":
        return [model]
    try:
        return [model.get_submodule(target)]
    except AttributeError:
        pass
    return [m for m in model.modules() if type(m).__name__ == target and m is not model] or (
        [model] if type(model).__name__ == target else [])


def install_compile(spec: CompileSpec, log: ApplyLog, *, single_thread_compile: bool = False) -> Undo:
    """On the first call of each model, replace the targeted modules' forward with a compiled one."""
    if single_thread_compile:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    done: set[int] = set()
    compiled: list[torch.nn.Module] = []

    def pre(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if id(module) in done:
            return None
        done.add(id(module))
        targets = matching_modules(module, spec.target)
        if not targets:
            log.skip("compile", f"{type(module).__name__} has no submodule or class named {spec.target!r}")
            return None
        for target in targets:
            if "forward" in target.__dict__:  # already replaced (a shared block)
                continue
            target.forward = _first_call_logged(
                torch.compile(target.forward, mode=spec.mode, dynamic=spec.dynamic, backend=spec.backend),
                log, f"{spec.label()}: {len(targets)} module(s) in {type(module).__name__}")
            compiled.append(target)
        return None

    remove_hooks = RootHooks(on_pre=pre).install()

    def undo() -> None:
        remove_hooks()
        for target in compiled:
            target.__dict__.pop("forward", None)

    return undo


def _first_call_logged(fn: Any, log: ApplyLog, what: str) -> Any:
    """``fn``, recording in ``log`` that the knob applied when a compiled region first runs.

    Replacing a forward changes nothing until it is called: a trial whose regions never ran is
    "not applied", never a measured (drift-only) speedup.
    """
    ran = [False]

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not ran[0]:
            ran[0] = True
            log.did("compile", what)
        return fn(*args, **kwargs)

    return forward


def compile_stats() -> dict[str, Any]:
    """Dynamo's counters for this process: graphs, graph breaks (with reasons), recompiles, compile time."""
    from torch._dynamo import utils

    counters = utils.counters
    breaks = dict(counters.get("graph_break", {}))
    failures = getattr(utils, "guard_failures", {}) or {}
    times = getattr(utils, "compilation_time_metrics", {}) or {}
    compile_s = sum(times.get("_compile.compile_inner", [])) + sum(times.get("backward._backward_impl", []))
    return {
        "graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
        "graph_breaks": int(sum(breaks.values())),
        "break_reasons": sorted(breaks, key=lambda r: -breaks[r])[:5],
        "recompiles": int(sum(len(v) for v in failures.values())),
        "recompile_reasons": [r for v in failures.values() for r in v][:5],
        "compile_ms": round(compile_s * 1000.0, 1),
    }


def reset_compile_stats() -> None:
    """Forget compiled code and dynamo's counters (a trial process starts clean; tests need this)."""
    from torch._dynamo import utils

    torch._dynamo.reset()
    utils.counters.clear()
    for name in ("guard_failures", "compilation_time_metrics"):
        table = getattr(utils, name, None)
        if table is not None:
            table.clear()

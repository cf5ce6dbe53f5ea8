"""torch.compile knob: compile a region of the model, hottest region first.

Regions, in the order the search tries them: the repeated blocks (every instance of the block
class of :mod:`torchscalpel.blocks`, e.g. ``Block``, and only when the baseline's forward called
it: the regional compile recipe, one compiled graph reused by all instances), the hottest
top-level submodule by measured forward time, then the whole model. The first time
the model is called, each matching module gets its compiled version where ``model.compile()`` puts
one: the instance's ``_compiled_call_impl``, which ``nn.Module.__getstate__`` leaves out of a pickle, so
a script's own ``torch.save(model, f)`` or ``copy.deepcopy(model)`` works as without compile (before, a
``forward`` instance attribute made ``torch.save(model, f)`` fail with a PicklingError and the trial was
lost). Unlike ``model.compile()``, which compiles ``_call_impl`` with the module's hooks inside the graph,
only ``forward`` is compiled: the call runs torch's own ``_call_impl`` with the compiled forward in
place for that call, so module hooks (the runtime's, the amp knob's root autocast) run outside the
graph. Undo deletes the attribute. The root model's first call, which installs the regions from its
pre-hook, has already chosen its call path: a region of the whole model compiles on the second call,
inside the warm-up steps.

On a CPU, inductor's own random numbers are turned off (``fallback_random``) when the model is
in training mode with active dropout: inductor generates dropout masks with a per-element RNG in
its fused C++ kernels, measured ~5x slower than eager's ``bernoulli_`` on char_transformer (each
fused dropout + layer-norm kernel 8-16 ms against ~2 ms for eager's mask), enough to make
compile lose. With the fallback the masks come from eager's generator: the same RNG stream as
the uncompiled script, so the loss curve matches it too.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.tune.knobs.base import CLOSE, ApplyLog, Knob, RootHooks, SetupHook, Undo, module_device
from torchscalpel.tune.settings import CompileSpec, TuneSettings

if TYPE_CHECKING:
    from torchscalpel.tune.facts import ModelFacts
    from torchscalpel.tune.triage import FailureRecorder


HOT_SHARE = 0.25
"""A submodule is a compile region of its own when it takes at least this share of the forward."""


class CompileKnob(Knob):
    """torch.compile of the hottest submodule, the repeated blocks, or the whole model."""

    name = "compile"
    numerics = CLOSE
    description = "torch.compile of a model region"

    def __init__(
        self, *, backend: str = "inductor", modes: tuple[str, ...] = ("default",), max_regions: int = 2
    ) -> None:
        self.backend = backend
        self.modes = modes
        self.max_regions = max_regions

    def is_set(self, settings: TuneSettings) -> bool:
        return settings.compile is not None

    def candidates(self, facts: ModelFacts) -> tuple[list[TuneSettings], str | None]:
        if not facts.models:
            return [], "no model forward call was seen"
        dynamic = True if facts.input_shapes_vary else None
        use_cache = False if facts.cache_in_training else None
        targets = region_targets(facts, self.max_regions)
        out: list[TuneSettings] = []

        def add(target: str, mode: str) -> None:
            spec = CompileSpec(
                target=target, mode=mode, dynamic=dynamic, backend=self.backend, use_cache=use_cache
            )
            if all(s.compile != spec for s in out):
                out.append(TuneSettings(compile=spec))

        before, after = profile_modes(facts, targets)
        for target, mode in before:
            add(target, mode)
        for target in targets:
            for mode in self.modes:
                add(target, mode)
        for target, mode in after:
            add(target, mode)
        return out, None

    def skipped_candidates(self, facts: ModelFacts) -> list[tuple[str, str]]:
        # The block region is tried only on a block the baseline's forward called: compiling a
        # class that never runs (a ModuleDict container, say) is a no-op whose "speedup" is drift.
        if facts.repeated and is_torch_layer(facts.repeated[0]["cls"]):
            return [
                (
                    f"compile({facts.repeated[0]['cls']})",
                    f"the repeated block is a single torch.nn.{facts.repeated[0]['cls']} layer: "
                    "compiled one at a time there is nothing to fuse; the hottest submodule and the "
                    "whole model are tried instead",
                )
            ]
        if not facts.models or facts.repeated:
            return []
        if facts.uncalled_blocks:
            names = ", ".join(facts.uncalled_blocks)
            return [("compile(blocks)", f"the repeated block class {names} is never called in the forward")]
        return [
            (
                "compile(blocks)",
                "no repeated block: no module class is called from a "
                "ModuleList/Sequential stack of two or more",
            )
        ]

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
        cpu = ["torch._inductor.config.fallback_random = True  # on a CPU with dropout: eager's faster RNG"]
        if spec.use_cache is False:
            cpu.append(
                "model.config.use_cache = False  # training builds no key/value cache for dynamo to guard"
            )
        if spec.target == "model":
            return [*cpu, f"model.compile({args})"]
        if "." in spec.target or spec.target[:1].islower():
            return [*cpu, f'model.get_submodule("{spec.target}").compile({args})']
        return [
            *cpu,
            "for module in model.modules():",
            f'    if type(module).__name__ == "{spec.target}":',
            f"        module.compile({args})",
        ]


GEMM_SHARE = 0.40
"""A CPU step is GEMM-bound when matmuls hold at least this share of op time (``gemm_ops``)."""
AUTOTUNE_ISAS = ("amx", "avx512")
"""CPU ISAs with inductor C++ GEMM micro-kernels worth autotuning against oneDNN (AMX tiles, AVX-512 FMA)."""


def profile_modes(
    facts: ModelFacts, targets: list[str]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Compile (region, mode) pairs the baseline's profile asks for: ``(before, after)`` the
    ``--compile-mode`` ones.

    - Launch-bound on CUDA (many short kernels, host time >= GPU time, or the GPU idle): CUDA graphs
      (``reduce-overhead``) on the hottest region and on the whole model, *before* the default mode,
      since one graph replay replaces hundreds of kernel launches. ``dynamic=True`` (shapes vary)
      rules CUDA graphs out: every new shape would record a graph. On a CPU ``reduce-overhead`` has no
      CUDA graphs, so the default mode is the analogue and nothing is added.
    - Compute-bound on CUDA: ``max-autotune`` on the first region, after the default mode.
    - GEMM-bound on a CPU with AMX or AVX-512 (matmuls >= :data:`GEMM_SHARE` of op time,
      ``facts.cpu_isa``): ``max-autotune-no-cudagraphs`` on the first region, after the default mode:
      inductor then benchmarks its C++ GEMM templates against oneDNN per matmul shape. Its compile is
      far longer (each choice is compiled and timed), which its pays-back line counts; the search
      runs it only with :data:`~torchscalpel.tune.budget.MAX_AUTOTUNE_MIN_S` left.
    """
    from torchscalpel.tune.bottleneck import Bottleneck

    bottleneck = Bottleneck.from_dict(facts.bottleneck)
    order = bottleneck.order()
    before: list[tuple[str, str]] = []
    after: list[tuple[str, str]] = []
    if facts.device == "cuda":
        if "launch" in order and not facts.input_shapes_vary:
            before += [(targets[0], "reduce-overhead"), ("model", "reduce-overhead")]
        if "compute" in order:
            after.append((targets[0], "max-autotune"))
    elif facts.device == "cpu":
        gemm = bottleneck.measures.get("gemm_ops", 0.0)
        if "compute" in order and gemm >= GEMM_SHARE and facts.cpu_isa in AUTOTUNE_ISAS:
            after.append((targets[0], "max-autotune-no-cudagraphs"))
    return before, after


def is_torch_layer(cls_name: str) -> bool:
    """True for a ``torch.nn`` layer class (``Conv2d``, ``Linear``): compiled one instance at a time
    there is nothing to fuse across, so the repeated-block region is not worth a trial for it."""
    layer = getattr(torch.nn, cls_name, None)
    return isinstance(layer, type) and issubclass(layer, torch.nn.Module)


def region_targets(facts: ModelFacts, limit: int) -> list[str]:
    """Compile targets in trial order: repeated blocks, hottest submodule, then the whole model.

    ``limit`` counts the whole model, which is always tried last.
    """
    containers = ("ModuleList", "ModuleDict", "Sequential")
    regions: list[str] = [r["cls"] for r in facts.repeated[:1] if not is_torch_layer(r["cls"])]
    # The hottest single submodule is worth its own trial only when it holds a real share of the
    # forward time (compiling a 3% embedding gains nothing measurable).
    timed = [
        s
        for s in facts.submodules
        if s.get("forward_ms") is not None and s["cls"] not in containers and s["cls"] not in regions
    ]
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
        [model] if type(model).__name__ == target else []
    )


def install_compile(spec: CompileSpec, log: ApplyLog, *, single_thread_compile: bool = False) -> Undo:
    """On the first call of each model, replace the targeted modules' forward with a compiled one."""
    if single_thread_compile:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    from torchscalpel.tune.triage import FailureRecorder

    # One backend object for every region: dynamo caches compiled code per backend identity, so a
    # backend per Block instance would recompile the same code for each instance.
    recorder = FailureRecorder(spec.backend, spec.mode, spec.dynamic)
    done: set[int] = set()
    compiled: list[torch.nn.Module] = []
    undo_random: list[Undo] = []
    undo_cache: list[Undo] = []
    if spec.dynamic:
        log.did(
            "compile",
            "dynamic=True: input shapes varied in the baseline (a last smaller batch?); "
            "drop_last=True on the DataLoader would keep them static instead",
        )

    def pre(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if id(module) in done:
            return None
        done.add(id(module))
        if not undo_random and needs_eager_random(module):
            undo_random.append(use_eager_random(log))
        if not undo_cache and spec.use_cache is False:
            undo_cache.append(no_cache_in_training(module, log))
        targets = matching_modules(module, spec.target)
        if not targets:
            log.skip("compile", f"{type(module).__name__} has no submodule or class named {spec.target!r}")
            return None
        for target in targets:
            if target.__dict__.get("_compiled_call_impl") is not None:  # done (a shared block), or the
                continue  # script's own model.compile(): its compile stays
            target._compiled_call_impl = CompiledRegion(
                target,
                spec,
                log,
                recorder,
                root=module,
                what=f"{spec.label()}: {len(targets)} module(s) in {type(module).__name__}",
            )
            compiled.append(target)
        return None

    remove_hooks = RootHooks(on_pre=pre).install()
    remove_marks = _mark_cudagraph_steps() if uses_cudagraphs(spec) else (lambda: None)

    def undo() -> None:
        remove_marks()
        remove_hooks()
        for target in compiled:
            target.__dict__.pop("_compiled_call_impl", None)
        for restore in [*undo_random, *undo_cache]:
            restore()

    return undo


def builds_cache_in_training(model: torch.nn.Module) -> bool:
    """True for a transformers model in training mode whose config asks for a key/value cache
    (``use_cache``, True by default): its forward then builds a ``DynamicCache`` nobody reads."""
    config = getattr(model, "config", None)
    return (
        model.training
        and getattr(config, "use_cache", None) is True
        and type(config).__module__.startswith("transformers")
    )


def no_cache_in_training(model: torch.nn.Module, log: ApplyLog) -> Undo:
    """``model.config.use_cache = False`` for a model :func:`builds_cache_in_training`, until undone.

    Why: the cache a training forward builds is thrown away, and under compile it is a guard on
    ``transformers/cache_utils.py`` state that recompiled the model during timed steps (a tiny Llama
    trial measured 2.69x, 1.37x and 0.23x in its three pairs). The loss does not change."""
    if not builds_cache_in_training(model):
        return lambda: None
    config: Any = getattr(model, "config", None)  # a transformers PretrainedConfig (checked above)
    config.use_cache = False
    log.did(
        "compile",
        f"{type(model).__name__}: config.use_cache=False (a model in training builds a key/value cache "
        "nobody reads; under compile its guards recompile)",
    )

    def undo() -> None:
        config.use_cache = True

    return undo


def needs_eager_random(model: torch.nn.Module) -> bool:
    """True for a CPU model in training mode with a dropout layer that draws masks (p > 0)."""
    if module_device(model).type != "cpu":
        return False  # on CUDA inductor's Philox RNG is fast
    return any(
        isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training and m.p > 0 for m in model.modules()
    )


def use_eager_random(log: ApplyLog) -> Undo:
    """``torch._inductor.config.fallback_random = True`` until undone (see the module docstring)."""
    import torch._inductor.config as inductor_config

    before = inductor_config.fallback_random
    inductor_config.fallback_random = True
    log.did("compile", "inductor fallback_random=True: dropout masks from eager's RNG (faster on a CPU)")

    def undo() -> None:
        inductor_config.fallback_random = before

    return undo


def uses_cudagraphs(spec: CompileSpec) -> bool:
    """``reduce-overhead`` / ``max-autotune`` record CUDA graphs when a GPU is there."""
    return spec.mode in ("reduce-overhead", "max-autotune") and torch.cuda.is_available()


def _mark_cudagraph_steps() -> Undo:
    """Tell cudagraph trees where each training iteration begins (after every optimizer step), so
    the replayed graphs may reuse the last iteration's output memory; without the mark a script
    that calls the model twice per step (evaluation, accumulation) reads overwritten outputs."""

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        torch.compiler.cudagraph_mark_step_begin()

    handle = torch.optim.optimizer.register_optimizer_step_post_hook(post)
    return handle.remove


_HOOK_DICTS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
)


@contextmanager
def no_global_forward_hooks() -> Iterator[None]:
    """Run the block with torch's global forward-hook tables empty (restored after, new ones kept).

    Why: dynamo guards on the *number* of global hooks, and the runtime swaps its global hooks for
    root-module hooks after warm-up; inside a compiled region the hooks are no-ops anyway (they
    return at once while compiling). Seen on char_transformer: every compile trial recompiled in
    its first measured step ("len(_global_forward_hooks) != 2"), 0.7-4.7 s of the timed window.
    """
    from torch.nn.modules import module as mod

    tables = [getattr(mod, name) for name in _HOOK_DICTS]
    saved = [dict(t) for t in tables]
    if not any(saved):
        yield
        return
    for t in tables:
        t.clear()
    try:
        yield
    finally:
        for t, old in zip(tables, saved, strict=True):
            new = dict(t)
            t.clear()
            t.update(old)
            t.update(new)


class CompiledRegion:
    """A module's compiled call (its ``_compiled_call_impl``, see the module doc), with triage on the first
    call: torch's ``_call_impl`` runs with the compiled forward in place of ``forward`` for the call.

    The first call tries ``fullgraph=True`` when the spec leaves it open: a region without graph
    breaks compiles as one graph and that is reported; a break is reported (file:line, reason) and
    the region compiles with breaks. A compile *failure* is attributed to one function (see
    :mod:`torchscalpel.tune.triage`), which is excluded with ``torch.compiler.disable``; the call is
    retried once and the exclusion is reported. Recording that the knob applied happens on the
    first call: a region that never runs leaves the trial "not applied".
    """

    def __init__(
        self,
        module: torch.nn.Module,
        spec: CompileSpec,
        log: ApplyLog,
        recorder: FailureRecorder,
        *,
        root: torch.nn.Module,
        what: str,
    ) -> None:
        self.module = module
        self.forward = module.forward  # the class's forward, bound: what is compiled
        self.spec = spec
        self.log = log
        self.root = root
        self.what = what
        self.recorder = recorder
        self.fn: Any = None
        self.retried = False

    def _compile(self, fullgraph: bool) -> Any:
        # The mode lives in the recorder (it wraps the backend as torch.compile configures it).
        return torch.compile(
            self.forward, dynamic=self.spec.dynamic, backend=self.recorder, fullgraph=fullgraph
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # torch's call path (hooks included) with this region's forward for the call only: between
        # calls the instance holds no ``forward`` of its own, so pickling it sees the plain module.
        state = self.module.__dict__
        had = state.get("forward")
        state["forward"] = self.run
        try:
            return self.module._call_impl(*args, **kwargs)
        finally:
            if had is None:
                state.pop("forward", None)
            else:
                state["forward"] = had

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The compiled forward (compiled on the first call, with triage)."""
        if self.fn is not None:
            with no_global_forward_hooks():
                try:
                    return self.fn(*args, **kwargs)
                except Exception as exc:
                    return self._retry(exc, args, kwargs)
        return self._first_call(args, kwargs)

    def _first_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from torch._dynamo.exc import Unsupported, UserError

        from torchscalpel.tune.triage import TRIAGE, user_frames

        self.log.did("compile", self.what)
        want_full = self.spec.fullgraph is not False
        with no_global_forward_hooks():
            if want_full:
                self.fn = self._compile(True)
                try:
                    out = self.fn(*args, **kwargs)
                    TRIAGE.fullgraph.setdefault("attempted", True)
                    TRIAGE.fullgraph.setdefault("ok", True)
                    return out
                except (Unsupported, UserError) as exc:
                    # Dynamo stops at the first break before running anything: falling back is safe.
                    frames = user_frames(
                        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                    )
                    where = f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""
                    TRIAGE.fullgraph.update(
                        attempted=True, ok=False, reason=str(exc).splitlines()[0][:300], where=where
                    )
                    if self.spec.fullgraph:  # asked for explicitly: a break is this trial's failure
                        raise
                except Exception as exc:
                    return self._retry(exc, args, kwargs)
            self.fn = self._compile(False)
            try:
                return self.fn(*args, **kwargs)
            except Exception as exc:
                return self._retry(exc, args, kwargs)

    def _retry(self, exc: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Exclude the function a compile failure points at and call once more; else re-raise."""
        from torchscalpel.tune.triage import TRIAGE, disable_function, is_compile_error

        if self.retried or not is_compile_error(exc) or self.recorder.frame is None:
            raise exc
        self.retried = True
        frame = self.recorder.frame
        name = disable_function(frame, [self.root])
        if name is None:
            raise exc
        inner = (
            getattr(exc, "inner_exception", None) or exc
        )  # BackendCompilerFailed wraps the backend's error
        text = str(inner).strip()
        cause = f"{type(inner).__name__}: {text.splitlines()[0][:300]}" if text else type(inner).__name__
        TRIAGE.excluded.append(
            {"function": name, "where": f"{frame[0]}:{frame[1]}", "cause": cause, "retried": "yes"}
        )
        self.log.did(
            "compile",
            f"compile failed in {name} ({frame[0]}:{frame[1]}): excluded with "
            "torch.compiler.disable and retried",
        )
        self.recorder.frame = None
        torch._dynamo.reset()
        self.fn = self._compile(False)
        with no_global_forward_hooks():
            return self.fn(*args, **kwargs)


def compile_stats() -> dict[str, Any]:
    """Dynamo's counters for this process: graphs, graph breaks (with file:line and reason),
    recompiles (with the guard that failed), fullgraph, excluded functions, compile time."""
    from torch._dynamo import utils

    from torchscalpel.tune.triage import TRIAGE, collect_dynamo

    collect_dynamo(TRIAGE)
    counters = utils.counters
    breaks = dict(counters.get("graph_break", {}))
    stats: Mapping[str, int] = counters.get("stats", {})  # not counters["stats"]: that would add the key
    failures = getattr(utils, "guard_failures", {}) or {}
    times = getattr(utils, "compilation_time_metrics", {}) or {}
    compile_s = sum(times.get("_compile.compile_inner", [])) + sum(times.get("backward._backward_impl", []))
    recompiles = int(sum(len(v) for v in failures.values()))
    return {
        "graphs": int(stats.get("unique_graphs", 0)),
        "graph_breaks": int(sum(breaks.values())),
        "break_reasons": sorted(breaks, key=lambda r: -breaks[r])[:5],
        "recompiles": max(recompiles, len(TRIAGE.recompiles)),
        "recompile_reasons": [r for v in failures.values() for r in v][:5],
        "compile_ms": round(compile_s * 1000.0, 1),
        **TRIAGE.to_dict(),
    }


def compile_progress() -> tuple[float, int, str]:
    """Seconds dynamo and inductor have spent compiling in this process so far, the recompiles so far
    and the last recompile's guard: read at each step's end, a change is a compile in that step."""
    from torch._dynamo import utils

    times = getattr(utils, "compilation_time_metrics", {}) or {}
    seconds = sum(times.get("_compile.compile_inner", [])) + sum(times.get("backward._backward_impl", []))
    failures = getattr(utils, "guard_failures", {}) or {}
    reasons = [r for v in failures.values() for r in v]
    last = reasons[-1].splitlines()[0][:300] if reasons else ""
    return float(seconds), len(reasons), last


def reset_compile_stats() -> None:
    """Forget compiled code and dynamo's counters (a trial process starts clean; tests need this)."""
    from torch._dynamo import utils

    from torchscalpel.tune import triage

    torch._dynamo.reset()
    utils.counters.clear()
    triage.TRIAGE = triage.TriageLog()
    triage.reset_dynamo_records()
    for name in ("guard_failures", "compilation_time_metrics"):
        table = getattr(utils, name, None)
        if table is not None:
            table.clear()

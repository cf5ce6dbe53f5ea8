"""Runtime performance rules: empty_cache every step, cudnn.benchmark with changing shapes, torch.compile
graph breaks and recompiles, host-device copies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules import loop_static
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr


class EmptyCacheInLoop(RuntimeRule):
    """torch.cuda.empty_cache() called during many steps."""

    info = loop_static.EMPTY_CACHE_IN_LOOP

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self.steps_with_calls: set[int] = set()
        self.calls = 0
        self.location: Location | None = None

    def setup(self) -> Undo:
        rule = self

        def seen() -> None:
            rule.calls += 1
            rule.steps_with_calls.add(rule.step)
            rule.location = rule.location or user_location()

        safe_seen = self.safe(seen)

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def empty_cache(*args: Any, **kwargs: Any) -> Any:
                safe_seen()
                return original(*args, **kwargs)

            return empty_cache

        import torch.cuda.memory as cuda_memory

        u1 = wrap_attr(torch.cuda, "empty_cache", make)
        u2 = wrap_attr(cuda_memory, "empty_cache", make)
        return undo_all([u1, u2])

    def on_step_end(self, step: Any) -> None:
        self.step += 1

    def findings(self, record: Any) -> Iterator[Finding]:
        if len(self.steps_with_calls) < 3:
            return
        yield loop_static.EMPTY_CACHE_IN_LOOP.finding(
            "torch.cuda.empty_cache() runs every step: it synchronises the GPU and returns cached memory, so the "
            "next step pays for cudaMalloc again; it never frees memory that tensors still use.",
            evidence=[
                f"{self.calls} call(s) during {len(self.steps_with_calls)} of {self.step} steps",
                f"called at {fmt_loc(self.location)}",
            ],
            fix="# delete the call; for fragmentation use\n# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            location=self.location,
        )


CUDNN_BENCHMARK_DYNAMIC_SHAPES = RuleInfo(
    slug="cudnn-benchmark-dynamic-shapes",
    severity=Severity.WARNING,
    category="performance",
    summary="cudnn.benchmark with input shapes that keep changing",
    kinds=("runtime",),
)


class CudnnBenchmarkDynamicShapes(RuntimeRule):
    """cudnn.benchmark on while convolution inputs change shape from call to call (re-tuning every new shape)."""

    info = CUDNN_BENCHMARK_DYNAMIC_SHAPES
    MIN_SHAPES = 4
    """With only the batch size changing, this many distinct shapes times two are needed to report."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: Counter[tuple[Any, ...]] = Counter()
        self.location: Location | None = None
        self._has_conv: dict[int, bool] = {}  # per root model: does it hold a conv or RNN?

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if not root or not torch.backends.cudnn.benchmark or not torch.is_grad_enabled():
            return
        from torch.nn.modules.conv import _ConvNd

        has = self._has_conv.get(id(module))
        if has is None:
            has = self._has_conv[id(module)] = any(
                isinstance(m, _ConvNd | torch.nn.RNNBase) for m in module.modules()
            )
        if not has:
            return
        shape = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        if shape:
            self.shapes[shape] += 1
            if len(self.shapes) == 2:
                self.location = user_location()

    def findings(self, record: Any) -> Iterator[Finding]:
        # A smaller last batch is one extra shape and harmless; changing spatial/sequence sizes are not.
        non_batch = {tuple(dims[1:] for dims in shape) for shape in self.shapes}
        if len(non_batch) < 3 and len(self.shapes) < 2 * self.MIN_SHAPES:
            return
        examples = ", ".join(str(list(s[0])) for s, _ in self.shapes.most_common(4))
        yield CUDNN_BENCHMARK_DYNAMIC_SHAPES.finding(
            f"torch.backends.cudnn.benchmark is on but the model saw {len(self.shapes)} different input shapes: "
            "cuDNN re-runs its algorithm search for every new shape.",
            evidence=[
                f"{sum(self.shapes.values())} calls, {len(self.shapes)} shapes, e.g. {examples}",
                f"called at {fmt_loc(self.location)}",
            ],
            fix="torch.backends.cudnn.benchmark = False   # for variable shapes\n"
            "# or pad/bucket inputs to a few fixed shapes",
            location=self.location,
        )


COMPILE_GRAPH_BREAKS = RuleInfo(
    slug="compile-graph-breaks",
    severity=Severity.WARNING,
    category="performance",
    summary="torch.compile graph breaks",
    kinds=("runtime",),
)


COMPILE_RECOMPILES = RuleInfo(
    slug="compile-recompiles",
    severity=Severity.WARNING,
    category="performance",
    summary="torch.compile recompiles after warm-up",
    kinds=("runtime",),
)


class CompileRules(RuntimeRule):
    """torch.compile graph breaks (with reasons) and recompilations (with the guard that failed)."""

    infos = (COMPILE_GRAPH_BREAKS, COMPILE_RECOMPILES)
    MIN_RECOMPILES = 2

    def __init__(self) -> None:
        super().__init__()
        self._metrics_start = 0
        self._breaks_start: Counter[str] = Counter()

    def on_start(self, session: Any) -> None:
        from torch._dynamo import utils

        self._metrics_start = len(utils.get_compilation_metrics())
        self._breaks_start = Counter(dict(utils.counters.get("graph_break", {})))

    def findings(self, record: Any) -> Iterator[Finding]:
        from torch._dynamo import utils

        breaks = Counter(dict(utils.counters.get("graph_break", {})))
        breaks.subtract(self._breaks_start)
        breaks = +breaks
        if breaks:
            total = sum(breaks.values())
            reasons = [f"{n}x {r.strip().splitlines()[0][:160]}" for r, n in breaks.most_common(5)]
            yield COMPILE_GRAPH_BREAKS.finding(
                f"torch.compile split the model at {total} graph break(s): each break returns to Python and "
                "limits fusion.",
                evidence=reasons,
                fix="# find them: torch._dynamo.explain(model)(x)\n# remove print()/.item()/data-dependent if in forward,"
                " or wrap them with torch.compiler.disable",
            )
        metrics = utils.get_compilation_metrics()[self._metrics_start :]
        # A graph compiled once per grad mode (train, then evaluation under no_grad, as nanoGPT does)
        # is bounded and expected: only other guard failures count.
        reasons = [
            reason
            for m in metrics
            if (reason := getattr(m, "recompile_reason", None)) and "changed: grad_mode" not in reason
        ]
        if len(reasons) >= self.MIN_RECOMPILES:
            shown = [r.strip().splitlines()[0][:160] for r in reasons[:4]]
            yield COMPILE_RECOMPILES.finding(
                f"torch.compile recompiled {len(reasons)} time(s) after the first compile: each recompile costs "
                "seconds and may hit the cache limit (then it falls back to eager).",
                evidence=[f"guard failed: {s}" for s in shown],
                fix="# mark the changing dimension dynamic, or stop passing changing Python scalars:\n"
                "torch._dynamo.mark_dynamic(x, 0)\nmodel = torch.compile(model, dynamic=True)",
            )


HOST_DEVICE_COPY_BOUND = RuleInfo(
    slug="host-device-copy-bound",
    severity=Severity.WARNING,
    category="performance",
    summary="host-device copies take at least 15% of step time",
    kinds=("runtime",),
)


class HostDeviceCopyBound(RuntimeRule):
    """Host-to-device copy time (GPU Memcpy HtoD in the profiler window) against profiled step time, on CUDA."""

    info = HOST_DEVICE_COPY_BOUND
    SHARE = 0.15
    PAGEABLE_SHARE = 0.05

    def findings(self, record: Any) -> Iterator[Finding]:
        if record is None or "cuda" not in str((record.config or {}).get("device", "")):
            return
        rows = list(record.op_summary().get("top_ops") or [])
        rows += list(((record.sections or {}).get("trace") or {}).get("top_kernels") or [])
        copy_us = pageable_us = 0.0
        seen: set[str] = set()
        for row in rows:
            name = str(row.get("name", ""))
            low = name.lower()
            if name in seen or "memcpy" not in low or "htod" not in low:
                continue
            seen.add(name)
            us = float(row.get("total_us", row.get("self_us", 0)) or 0)
            copy_us += us
            if "pageable" in low:
                pageable_us += us
        # The profiler window's steps only: the FLOP-counting step is marked profiled too, but its copies
        # are not in the trace.
        steps = [s for s in record.steps if s.profiled and not s.flops_counted]
        step_us = sum(s.total_ms for s in steps) * 1000.0
        if not step_us:
            return
        share, pageable = copy_us / step_us, pageable_us / step_us
        if share < self.SHARE and pageable < self.PAGEABLE_SHARE:
            return
        yield HOST_DEVICE_COPY_BOUND.finding(
            f"Host-to-device copies take {share:.0%} of step time in the profiled steps"
            + (
                f", {pageable:.0%} from pageable memory (synchronous, cannot overlap)."
                if pageable_us
                else "."
            ),
            evidence=[
                f"{copy_us / 1000:.1f} ms of Memcpy HtoD over {len(steps)} profiled steps ({step_us / 1000:.1f} ms)"
            ],
            fix="DataLoader(..., pin_memory=True)\nx = x.to(device, non_blocking=True)\n"
            "# keep constant tensors on the GPU instead of copying them every step",
        )

"""Static FSDP rules, for FSDP1 (``FullyShardedDataParallel(...)``) as the tutorials write it and FSDP2 (``fully_shard``).

Each rule reads one function (or the module's top level) at a time: statements inside a nested ``def`` or class
belong to that function's own scope, so an optimizer in ``main()`` is never paired with a wrap in ``setup()``, and
one case is reported once.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.static import StaticContext, StaticRule, own_nodes
from torchscalpel.findings import Finding, Severity

_FSDP1 = "FullyShardedDataParallel"
_FSDP2 = "fully_shard"


def _wrap_kind(ctx: StaticContext, call: ast.Call) -> str | None:
    """``"FullyShardedDataParallel"`` or ``"fully_shard"`` for a call that wraps a model with FSDP, else None."""
    name = (ctx.call_name(call) or "").rsplit(".", 1)[-1]
    if name in (_FSDP1, _FSDP2) and (call.args or call.keywords):
        return name
    return None


def _is_optimizer(ctx: StaticContext, call: ast.Call) -> bool:
    name = ctx.call_name(call) or ""
    return name.startswith("torch.optim.") and name.count(".") == 2 and name.split(".")[2][:1].isupper()


def _wrapped_model(call: ast.Call) -> ast.AST | None:
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg in ("module", "model")), None)


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def optimizer_before_fsdp(ctx: StaticContext) -> Iterator[Finding]:
    """An optimizer built from a model's parameters earlier in the same function than that model's FSDP wrap."""
    for scope in ctx.scopes():
        optimizers: list[tuple[ast.Call, set[str]]] = []
        for call in ctx.own_calls(scope):
            if _is_optimizer(ctx, call):
                used = {n.id for a in call.args[:1] for n in ast.walk(a) if isinstance(n, ast.Name)}
                optimizers.append((call, used))
                continue
            kind = _wrap_kind(ctx, call)
            if kind is None:
                continue
            target = {n.id for n in ast.walk(_wrapped_model(call) or call) if isinstance(n, ast.Name)}
            for opt_call, used in [o for o in optimizers if o[1] & target]:
                optimizers.remove((opt_call, used))  # one finding per optimizer, at the first wrap after it
                yield ctx.finding(
                    OPTIMIZER_BEFORE_FSDP,
                    call,
                    _BEFORE_WRAP[kind],
                    evidence=[f"optimizer built at {ctx.path}:{opt_call.lineno}: {ctx.line_text(opt_call)}"],
                    fix=(
                        f"model = {kind}(model)  # first\noptimizer = torch.optim.AdamW(model.parameters())"
                        if kind == _FSDP1
                        else "fully_shard(model)  # first\noptimizer = torch.optim.AdamW(model.parameters())"
                    ),
                )


_BEFORE_WRAP = {
    _FSDP2: "fully_shard() runs after the optimizer was built: fully_shard replaces the parameters with sharded "
    "DTensors, so the optimizer updates the old, unused tensors.",
    _FSDP1: "FullyShardedDataParallel() wraps the model after the optimizer was built: FSDP flattens the "
    "parameters into sharded FlatParameters, so the optimizer updates the old, unused tensors and the model "
    "never trains.",
}


def _fsdp1_models(ctx: StaticContext) -> dict[str, ast.Call]:
    """Names assigned from ``FullyShardedDataParallel(...)`` anywhere in the file, with the wrapping call."""
    models: dict[str, ast.Call] = {}
    for node in ast.walk(ctx.tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and _wrap_kind(ctx, node.value) == _FSDP1
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    models[target.id] = node.value
                elif isinstance(target, ast.Attribute):
                    models[target.attr] = node.value
    return models


def _owner(node: ast.AST) -> str | None:
    """``model`` for ``model.parameters()`` and ``self.model.parameters()``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parameters":
        owner = node.func.value
        if isinstance(owner, ast.Name):
            return owner.id
        if isinstance(owner, ast.Attribute):
            return owner.attr
    return None


def clip_on_fsdp1_wrapper(ctx: StaticContext) -> Iterator[Finding]:
    """``torch.nn.utils.clip_grad_norm_(model.parameters(), ...)`` on a ``FullyShardedDataParallel`` model."""
    models = _fsdp1_models(ctx)
    if not models:
        return
    for call in ctx.calls():
        name = ctx.call_name(call) or ""
        if not name.endswith("clip_grad_norm_") or not name.startswith("torch.") or not call.args:
            continue
        owner = _owner(call.args[0])
        if owner is None or owner not in models:
            continue
        wrap = models[owner]
        yield ctx.finding(
            CLIP_GRAD_ON_FSDP_WRAPPER,
            call,
            f"torch.nn.utils.clip_grad_norm_ on the parameters of FullyShardedDataParallel model '{owner}': each "
            "rank holds only its shard of the gradients, so each computes the norm of its own shard, the ranks "
            "clip by different factors and none clips by the true total norm.",
            evidence=[f"'{owner}' wrapped at {ctx.path}:{wrap.lineno}: {ctx.line_text(wrap)}"],
            fix=f"{owner}.clip_grad_norm_(max_norm)  # FSDP's own: reduces the norm over every shard",
        )


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def fsdp_cpu_offload(ctx: StaticContext) -> Iterator[Finding]:
    """``CPUOffload(offload_params=True)``: every step copies the parameters to the device and back."""
    for call in ctx.calls():
        name = ctx.call_name(call) or ""
        if name.rsplit(".", 1)[-1] != "CPUOffload" or "fsdp" not in name:
            continue
        offload = _keyword(call, "offload_params") or (call.args[0] if call.args else None)
        if not _is_true(offload):
            continue
        yield ctx.finding(
            FSDP_CPU_OFFLOAD,
            call,
            "FSDP offloads the parameters and gradients to host memory: every step copies each unit to the device "
            "before its forward and backward and the gradients back, and the optimizer steps on the CPU. That is "
            "several times slower than keeping them on the device, and pays only when the sharded model does not "
            "fit there.",
            evidence=[
                "scalpel plan -- SCRIPT prices each strategy's memory per rank: offload only if none fits"
            ],
            fix="FullyShardedDataParallel(model)  # no cpu_offload= while the sharded model fits on the device",
        )


_LOW = {"float16", "half", "bfloat16"}


def _dtype_word(ctx: StaticContext, node: ast.AST | None) -> str | None:
    if node is None:
        return None
    name = ctx.qualname(node) or ""
    word = name.rsplit(".", 1)[-1]
    return word if word in _LOW else None


def _mixed_precision_calls(ctx: StaticContext) -> Iterator[tuple[ast.Call, str]]:
    """Each ``MixedPrecision(param_dtype=<low precision>)`` call, with that dtype's name."""
    for call in ctx.calls():
        name = ctx.call_name(call) or ""
        if name.rsplit(".", 1)[-1] != "MixedPrecision" or "fsdp" not in name:
            continue  # FSDP1's policy (torch.distributed.fsdp.MixedPrecision), not Lightning's plugin
        param = _dtype_word(ctx, _keyword(call, "param_dtype") or (call.args[0] if call.args else None))
        if param is not None:
            yield call, param


def fsdp_fp16_plain_scaler(ctx: StaticContext) -> Iterator[Finding]:
    """FSDP1 fp16 parameters (``MixedPrecision(param_dtype=torch.float16)``) with torch's plain ``GradScaler``."""
    scaler = next(
        (c for c in ctx.calls() if (ctx.call_name(c) or "").rsplit(".", 1)[-1] == "GradScaler"),
        None,
    )  # ShardedGradScaler's name ends differently, so it never matches
    if scaler is None:
        return
    for call, param in _mixed_precision_calls(ctx):
        if param in ("float16", "half"):
            yield ctx.finding(
                FSDP_FP16_PLAIN_GRAD_SCALER,
                scaler,
                "FSDP keeps fp16 parameters (MixedPrecision(param_dtype=torch.float16)) but the loss is scaled by "
                "torch's plain GradScaler: it checks only this rank's gradient shard for inf/NaN, so one rank can "
                "skip a step another takes and the replicas drift apart.",
                evidence=[f"MixedPrecision at {ctx.path}:{call.lineno}: {ctx.line_text(call)}"],
                fix="from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler\n"
                "scaler = ShardedGradScaler()",
            )
            return  # one scaler, one finding


def _cast_dtype(ctx: StaticContext, call: ast.Call) -> str | None:
    """The dtype of ``x.half()``, ``x.bfloat16()``, ``x.to(torch.bfloat16)`` or ``x.to(dtype=...)``, else None."""
    if not isinstance(call.func, ast.Attribute):
        return None
    method = call.func.attr
    if method in ("half", "bfloat16") and not call.args:
        return "float16" if method == "half" else "bfloat16"
    if method == "to":
        for arg in [*call.args, *(k.value for k in call.keywords if k.arg == "dtype")]:
            word = _dtype_word(ctx, arg)
            if word is not None:
                return "float16" if word == "half" else word
    return None


def _cast_in_chain(ctx: StaticContext, node: ast.AST) -> str | None:
    """The low-precision dtype a call chain (``Net().to(rank).to(torch.bfloat16)``) casts to, else None."""
    while isinstance(node, ast.Call):
        dtype = _cast_dtype(ctx, node)
        if dtype is not None:
            return dtype
        node = node.func.value if isinstance(node.func, ast.Attribute) else node.func
    return None


def _casts(ctx: StaticContext, node: ast.AST) -> Iterator[tuple[str, str]]:
    """(name, dtype) for ``model = <...>.to(torch.bfloat16)`` and for a bare ``model.half()`` statement."""
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
        dtype = _cast_in_chain(ctx, node.value)
        if dtype is not None:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, dtype
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        call = node.value
        dtype = _cast_dtype(ctx, call)
        if (
            dtype is not None
            and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name)
        ):
            yield call.func.value.id, dtype  # modules cast in place


def fsdp_low_precision_master(ctx: StaticContext) -> Iterator[Finding]:
    """A model cast to bf16/fp16 before ``FullyShardedDataParallel(model, mixed_precision=...)`` in one function.

    MixedPrecision's ``param_dtype`` is the dtype FSDP computes in; the sharded parameters the optimizer updates
    keep the model's own dtype. Casting the model first leaves no fp32 copy: updates smaller than the weight's
    last bf16 bit round away."""
    for scope in ctx.scopes():
        casts: dict[str, tuple[ast.AST, str]] = {}
        for node in own_nodes(scope):
            for name, dtype in _casts(ctx, node):
                casts.setdefault(name, (node, dtype))
            if not isinstance(node, ast.Call):
                continue
            call = node
            if _wrap_kind(ctx, call) != _FSDP1 or _keyword(call, "mixed_precision") is None:
                continue
            model = _wrapped_model(call)
            if isinstance(model, ast.Name) and model.id in casts:
                cast_call, dtype = casts.pop(model.id)
                yield ctx.finding(
                    FSDP_LOW_PRECISION_MASTER_WEIGHTS,
                    cast_call,
                    f"'{model.id}' is cast to {dtype} before FullyShardedDataParallel(..., mixed_precision=...): "
                    "MixedPrecision already computes in its param_dtype, and the sharded parameters the optimizer "
                    f"updates keep the model's dtype, so after this cast there is no fp32 copy and updates smaller "
                    f"than a {dtype} weight's last bit are lost.",
                    evidence=[f"wrapped at {ctx.path}:{call.lineno}: {ctx.line_text(call)}"],
                    fix=f"# keep '{model.id}' in float32; MixedPrecision(param_dtype=torch.{dtype}) casts for "
                    "compute\nmodel = FullyShardedDataParallel(model, mixed_precision=policy)",
                )


OPTIMIZER_BEFORE_FSDP = RuleInfo(
    slug="optimizer-before-fsdp",
    severity=Severity.ERROR,
    category="distributed",
    summary="optimizer built before FSDP wraps the model: it holds the unsharded parameters",
    kinds=("static", "runtime"),
)


class OptimizerBeforeFsdpStatic(StaticRule):
    info = OPTIMIZER_BEFORE_FSDP
    check = staticmethod(optimizer_before_fsdp)


CLIP_GRAD_ON_FSDP_WRAPPER = RuleInfo(
    slug="clip-grad-on-fsdp-wrapper",
    severity=Severity.ERROR,
    category="distributed",
    summary="torch.nn.utils.clip_grad_norm_ on an FSDP1 model clips each rank by its own shard's norm",
    kinds=("static",),
)


class ClipOnFsdp1WrapperStatic(StaticRule):
    info = CLIP_GRAD_ON_FSDP_WRAPPER
    check = staticmethod(clip_on_fsdp1_wrapper)


FSDP_CPU_OFFLOAD = RuleInfo(
    slug="fsdp-cpu-offload",
    severity=Severity.WARNING,
    category="performance",
    summary="FSDP CPUOffload(offload_params=True): host-device copies every step",
    kinds=("static",),
)


class FsdpCpuOffloadStatic(StaticRule):
    info = FSDP_CPU_OFFLOAD
    check = staticmethod(fsdp_cpu_offload)


FSDP_FP16_PLAIN_GRAD_SCALER = RuleInfo(
    slug="fsdp-fp16-plain-grad-scaler",
    severity=Severity.ERROR,
    category="distributed",
    summary="FSDP fp16 parameters with torch's plain GradScaler instead of ShardedGradScaler",
    kinds=("static",),
)


class FsdpFp16PlainScalerStatic(StaticRule):
    info = FSDP_FP16_PLAIN_GRAD_SCALER
    check = staticmethod(fsdp_fp16_plain_scaler)


FSDP_LOW_PRECISION_MASTER_WEIGHTS = RuleInfo(
    slug="fsdp-low-precision-master-weights",
    severity=Severity.WARNING,
    category="numerics",
    summary="model cast to bf16/fp16 before FSDP MixedPrecision: no fp32 weights for the optimizer",
    kinds=("static",),
)


class FsdpLowPrecisionMasterStatic(StaticRule):
    info = FSDP_LOW_PRECISION_MASTER_WEIGHTS
    check = staticmethod(fsdp_low_precision_master)

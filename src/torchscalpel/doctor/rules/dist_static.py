"""Static distributed rules: rank-conditional collectives, DataParallel, DDP device ids, samplers (FSDP: fsdp_static)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.static import StaticContext, StaticRule
from torchscalpel.findings import Finding, Severity

_COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "monitored_barrier",
}
_RANK_WORDS = ("rank", "is_main", "is_master", "main_process", "master_process")


def _is_rank_test(ctx: StaticContext, test: ast.AST) -> bool:
    """True for conditions that depend on the process rank (rank == 0, is_main_process(), ...)."""
    for node in ast.walk(test):
        if isinstance(node, ast.Name) and any(w in node.id.lower() for w in _RANK_WORDS):
            return True
        if isinstance(node, ast.Attribute) and any(w in node.attr.lower() for w in _RANK_WORDS):
            return True
    return False


def _step_like(ctx: StaticContext, call: ast.Call) -> str | None:
    """What kind of lock-step operation ``call`` is (backward, optimizer step, collective), else None."""
    name = ctx.call_name(call) or ""
    if name.startswith("torch.distributed.") and name.rsplit(".", 1)[-1] in _COLLECTIVES:
        return f"collective {name.rsplit('.', 1)[-1]}"
    if name in {"torch.distributed.checkpoint.save", "torch.distributed.checkpoint.load"}:
        return f"collective {name}"
    if isinstance(call.func, ast.Attribute):
        if call.func.attr == "backward":
            return "backward"
        if call.func.attr == "step":
            owner = ctx.qualname(call.func.value) or ""
            if "opt" in owner.lower() and "sched" not in owner.lower():
                return "optimizer step"
    return None


def rank_conditional_step(ctx: StaticContext) -> Iterator[Finding]:
    """backward / optimizer step / a collective inside ``if <rank test>:`` (hang or divergence risk)."""
    barriers_under_rank = sum(
        1
        for node in ast.walk(ctx.tree)
        if isinstance(node, ast.If) and _is_rank_test(ctx, node.test)
        for call in ctx.calls(node)
        if (ctx.call_name(call) or "").endswith(".barrier")
    )
    for node in ast.walk(ctx.tree):
        if not isinstance(node, ast.If) or not _is_rank_test(ctx, node.test):
            continue
        # `if rank == src: broadcast(x) else: broadcast(y)`: every rank joins, only the arguments differ.
        other_side = {_step_like(ctx, c) for stmt in node.orelse for c in ctx.calls(stmt)} - {None}
        for stmt in node.body:
            for call in ctx.calls(stmt):
                kind = _step_like(ctx, call)
                if kind is None or kind in other_side:
                    continue
                # `if rank != 0: barrier()` ... `if rank == 0: barrier()` is the paired "rank 0 first" idiom.
                if kind == "collective barrier" and barriers_under_rank >= 2:
                    continue
                yield ctx.finding(
                    RANK_CONDITIONAL_STEP,
                    call,
                    f"{kind} runs only on the ranks where `{ast.unparse(node.test)}` holds: the other ranks wait "
                    "forever (collectives) or their replicas diverge (backward/step).",
                    fix="# run backward, optimizer.step and collectives on every rank;\n"
                    "# guard only printing/saving with the rank test:\nif rank == 0:\n    print(loss.item())",
                )


def dataparallel_used(ctx: StaticContext) -> Iterator[Finding]:
    """``nn.DataParallel(...)`` anywhere."""
    for call in ctx.calls():
        if ctx.call_name(call) in {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel"}:
            yield ctx.finding(
                DATAPARALLEL_USED,
                call,
                "nn.DataParallel replicates the model from one Python thread every step and is slower than "
                "DistributedDataParallel even on one machine.",
                fix="# launch with: torchrun --nproc_per_node N train.py\n"
                "dist.init_process_group('nccl')\nmodel = DDP(model.to(local_rank), device_ids=[local_rank])",
            )


_DDP = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.nn.DistributedDataParallel",
}


def _fixed_device(ctx: StaticContext, node: ast.AST) -> str | None:
    """``0`` for a literal device index, ``get_rank()`` for the global rank: not the local device."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return str(node.value)
    if isinstance(node, ast.Call) and (ctx.call_name(node) or "").endswith("get_rank"):
        return "dist.get_rank()"
    return None


def ddp_device_ids(ctx: StaticContext) -> Iterator[Finding]:
    """``DDP(model, device_ids=[0])`` (or the global rank): every rank on one GPU, or past the node's GPUs."""
    for call in ctx.calls():
        if ctx.call_name(call) not in _DDP:
            continue
        for kw in call.keywords:
            if kw.arg == "device_ids" and isinstance(kw.value, ast.List | ast.Tuple) and kw.value.elts:
                fixed = _fixed_device(ctx, kw.value.elts[0])
                if fixed is not None:
                    yield ctx.finding(
                        DDP_DEVICE_IDS_NOT_LOCAL_RANK,
                        call,
                        f"DDP(device_ids=[{fixed}]) is not this rank's LOCAL_RANK: "
                        + (
                            "every rank uses the same GPU."
                            if fixed != "dist.get_rank()"
                            else "the global rank runs past the GPUs of a node after the first."
                        ),
                        fix="local_rank = int(os.environ['LOCAL_RANK'])\ntorch.cuda.set_device(local_rank)\n"
                        "model = DDP(model.to(local_rank), device_ids=[local_rank])",
                    )


_DIST_SAMPLERS = {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}


def sampler_set_epoch_missing(ctx: StaticContext) -> Iterator[Finding]:
    """A shuffling DistributedSampler is built but ``set_epoch`` is never called in the file."""
    if ctx.mentions_attr("set_epoch"):
        return
    for call in ctx.calls():
        if ctx.call_name(call) not in _DIST_SAMPLERS:
            continue
        shuffle = next((k.value for k in call.keywords if k.arg == "shuffle"), None)
        if isinstance(shuffle, ast.Constant) and shuffle.value is False:
            continue
        yield ctx.finding(
            SAMPLER_SET_EPOCH_MISSING,
            call,
            "DistributedSampler shuffles with a seed derived from its epoch, and set_epoch() is never called: "
            "every epoch sees the same order.",
            fix="for epoch in range(epochs):\n    sampler.set_epoch(epoch)\n    for batch in loader: ...",
        )


def _world_size_literals(ctx: StaticContext) -> set[int]:
    """World sizes the file itself fixes: ``init_process_group(world_size=N)``, ``mp.spawn(nprocs=N)``."""
    found: set[int] = set()
    for call in ctx.calls():
        name = (ctx.call_name(call) or "").rsplit(".", 1)[-1]
        for kw in call.keywords:
            if (
                (
                    (name == "init_process_group" and kw.arg == "world_size")
                    or (name in {"spawn", "start_processes"} and kw.arg == "nprocs")
                )
                and isinstance(kw.value, ast.Constant)
                and isinstance(kw.value.value, int)
            ):
                found.add(kw.value.value)
    return found


def _int_constant(ctx: StaticContext, node: ast.AST | None) -> ast.AST | None:
    """``node`` itself, or the literal a name (``WORLD = 8``) is assigned once and only in the file."""
    if not isinstance(node, ast.Name):
        return node
    values = [
        n.value
        for n in ast.walk(ctx.tree)
        if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign)
        and any(
            isinstance(t, ast.Name) and t.id == node.id
            for t in getattr(n, "targets", [getattr(n, "target", None)])
        )
    ]
    return values[0] if len(values) == 1 and isinstance(values[0], ast.Constant) else node


def sampler_num_replicas(ctx: StaticContext) -> Iterator[Finding]:
    """``DistributedSampler(..., num_replicas=<int literal>)`` that the file does not tie to its world size:
    launched on another number of processes, the ranks read overlapping or missing shards."""
    fixed = _world_size_literals(ctx)
    for call in ctx.calls():
        if ctx.call_name(call) not in _DIST_SAMPLERS:
            continue
        given = next((k.value for k in call.keywords if k.arg == "num_replicas"), None)
        if given is None and len(call.args) >= 2:
            given = call.args[1]
        value = _int_constant(ctx, given)
        if not isinstance(value, ast.Constant) or not isinstance(value.value, int) or value.value in fixed:
            continue
        n = value.value
        fixed_note = f" (the file sets the world size to {sorted(fixed)})" if fixed else ""
        yield ctx.finding(
            DISTRIBUTED_SAMPLER_WRONG_WORLD,
            call,
            f"DistributedSampler(num_replicas={n}) is a constant{fixed_note}: on any other number of processes "
            f"the ranks split the data {n} ways, so samples are read twice or never.",
            fix="sampler = DistributedSampler(dataset)  # num_replicas and rank default to the process group's\n"
            "# or explicitly: DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank())",
        )


RANK_CONDITIONAL_STEP = RuleInfo(
    slug="rank-conditional-step",
    severity=Severity.ERROR,
    category="distributed",
    summary="backward, optimizer step or a collective run only on some ranks",
    kinds=("static", "runtime"),
)


class RankConditionalStepStatic(StaticRule):
    info = RANK_CONDITIONAL_STEP
    check = staticmethod(rank_conditional_step)


DATAPARALLEL_USED = RuleInfo(
    slug="dataparallel-used",
    severity=Severity.WARNING,
    category="distributed",
    summary="nn.DataParallel is slower than DDP and deprecated in spirit",
    kinds=("static", "runtime"),
)


class DataParallelUsedStatic(StaticRule):
    info = DATAPARALLEL_USED
    check = staticmethod(dataparallel_used)


DDP_DEVICE_IDS_NOT_LOCAL_RANK = RuleInfo(
    slug="ddp-device-ids-not-local-rank",
    severity=Severity.ERROR,
    category="distributed",
    summary="DDP device_ids that are not [LOCAL_RANK]",
    kinds=("static",),
)


class DdpDeviceIdsStatic(StaticRule):
    info = DDP_DEVICE_IDS_NOT_LOCAL_RANK
    check = staticmethod(ddp_device_ids)


SAMPLER_SET_EPOCH_MISSING = RuleInfo(
    slug="sampler-set-epoch-missing",
    severity=Severity.WARNING,
    category="distributed",
    summary="DistributedSampler.set_epoch never called: same order every epoch",
    kinds=("static", "runtime"),
)


class SamplerSetEpochMissingStatic(StaticRule):
    info = SAMPLER_SET_EPOCH_MISSING
    check = staticmethod(sampler_set_epoch_missing)


DISTRIBUTED_SAMPLER_WRONG_WORLD = RuleInfo(
    slug="distributed-sampler-wrong-world",
    severity=Severity.ERROR,
    category="distributed",
    summary="DistributedSampler(num_replicas=...) that disagrees with the world size",
    kinds=("static", "runtime"),
)


class SamplerNumReplicasStatic(StaticRule):
    info = DISTRIBUTED_SAMPLER_WRONG_WORLD
    check = staticmethod(sampler_num_replicas)

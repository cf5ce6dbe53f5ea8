"""The fix ladder: what to change so the run fits, each rung with its number from the plan.

The plan (:mod:`torchscalpel.plan`) simulates the script's own model, batch and optimizer on fake
tensors; the ladder asks it the questions an engineer would: how much does activation checkpointing of
the repeated blocks save, what is the largest batch that fits the limit, how many micro-batches keep the
global batch, how much does bf16 autocast save, how much would an optimizer with less state save. The
rungs that ``scalpel run`` can apply carry the ``[tune]`` settings that do it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchscalpel.plan.script import PlanObserver

MICRO_MARGIN = 0.75
"""A micro-batch is at most this share of the plan's largest batch: the split keeps the whole batch's
output and its gradient, and the recompute overlaps the next chunk's gradients."""

MICRO_DOUBLINGS = 2
"""When the simulated K micro-batches still go over the limit, 2K and then 4K are simulated (at most)."""

PLAN_MARGIN = 0.08
"""A rung the plan simulates fits when its plan peak is at most this share below the limit: on the held-out
scripts the plan's peak ran 3-8% below what ``scalpel run`` measured with the rung applied (bf16 up to 10%,
BENCHMARKS.md), and a rung at 99% of the limit (GPT-2 in bf16) then did not fit."""

BF16_MARGIN = 0.15
"""The same for the bf16 rung, whose plan peak ran 2.5-10% below the measured one and once more than 10% (an
MLP of Linear + GELU at batch 2048: 18.2 MiB planned, over 20 MiB measured): autocast's casts are not all planned."""

FRAGMENTATION_SHARE = 0.2
"""Reserved-but-unallocated memory above this share of reserved recommends expandable segments."""


class _NoStop:
    """The session, minus ``request_stop``: the memory run must not end at the plan's first step."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def request_stop(self, reason: str) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class LadderPlanObserver(PlanObserver):
    """The plan's script observer (model, batch, optimizer of the first step) without its stop.

    It also notes, at the model's first training forward, whether a BatchNorm was training: the
    micro-batch knob refuses such a model (the split would change the batch statistics), so the ladder
    must not offer it as a ``[tune]`` fix.
    """

    name = "memory-plan"
    batchnorm: str | None = None
    """Why micro-batching is refused for this model (None when it is not)."""
    _norms_checked = False

    def on_start(self, session: Any) -> None:
        super().on_start(_NoStop(session))

    def on_forward_pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], root: bool) -> None:
        super().on_forward_pre(module, args, kwargs, root)
        # the model the plan captured (a loss module or a frozen teacher is not), in a training forward
        captured = self.model is not None and (
            self.model is module or getattr(module, "module", None) is self.model
        )
        if root and captured and not self._norms_checked and module.training:
            import torch

            if torch.is_grad_enabled():
                from torchscalpel.tune.knobs.microbatch import batch_statistics_modules, batchnorm_reason

                self._norms_checked = True
                self.batchnorm = batchnorm_reason(module, batch_statistics_modules(module))


def plan_budget(limit: int, margin: float = PLAN_MARGIN) -> int:
    """The plan peak under which a simulated rung is said to fit the ``limit`` (see :data:`PLAN_MARGIN`)."""
    return int(limit * (1 - margin))


def micro_batches(batch: int, max_batch: int) -> int:
    """K micro-batches of equal size (the loss scaling stays exact), each at most MICRO_MARGIN of ``max_batch``."""
    k = max(2, -(-batch // max(1, int(max_batch * MICRO_MARGIN))))
    while batch % k and k < batch:
        k += 1
    return k


def _with_microbatches(k: int, simulate_step: Any) -> Any:
    """Run one plan simulation with the micro-batch knob installed (it splits the fake model's calls too)."""
    from torchscalpel.tune.knobs import ApplyLog
    from torchscalpel.tune.knobs.microbatch import install_microbatching

    undo = install_microbatching(k, ApplyLog())
    try:
        return simulate_step()
    finally:
        undo()


def plan_numbers(obs: LadderPlanObserver, limit: int, cause: str) -> dict[str, Any]:
    """Simulate the captured step with the plan and answer the ladder's questions for ``cause``.

    Only the simulations the cause needs run (each is a fake-tensor training step): the baseline;
    for activations, the same step with block checkpointing, with bf16 autocast and at half the batch
    (the largest fitting batch is the plan's peak, linear in the batch, solved for the limit: two
    simulations instead of a search); for optimizer state, the step with SGD (one buffer per parameter).
    """
    from torchscalpel.plan.devices import Device
    from torchscalpel.plan.simulate import (
        OptimizerSpec,
        SimSettings,
        build_meta_model,
        sim_settings_for,
        simulate,
    )
    from torchscalpel.plan.strategies import evaluate

    if obs.model is None:
        return {"error": "the script never called a model, so there is nothing to plan"}
    device = Device(name="the memory limit", memory=limit, kind="cpu")
    optimizer = obs.optimizer or OptimizerSpec.named("none")
    batch, loss_fn, _ = obs.inputs()
    precision = obs.precision()
    accum = obs.micro_batches()
    builder = obs.meta_builder()
    base_settings = sim_settings_for(optimizer, precision, accum, device)

    def run(settings: SimSettings, size: int | None = None) -> tuple[int, Any]:
        m = simulate(
            lambda: build_meta_model(builder, settings.precision),
            batch if size is None else batch.with_batch(size),
            settings,
            loss_fn,
        )
        bd = evaluate(
            m, "single", world_size=1, nodes=1, device=device, checkpointing=settings.checkpoint_blocks
        )
        return bd.peak, m

    peak, m = run(base_settings)
    b = batch.batch_size
    out: dict[str, Any] = {
        "batch": b,
        "precision": precision,
        "optimizer": optimizer.label,
        "peak": peak,
        "activations_peak": m.act_peak_bytes,
        "optimizer_state": m.optim_bytes,
        "blocks": len(m.blocks),
        "batchnorm": obs.batchnorm,
    }
    if cause in ("activations", "temporaries"):
        if m.blocks:
            out["checkpointed_peak"], _ = run(dataclasses.replace(base_settings, checkpoint_blocks=True))
        if b and b >= 2:
            half_peak, _ = run(base_settings, b // 2)
            per_sample = (peak - half_peak) / (b - b // 2)
            fixed = peak - per_sample * b
            out["max_batch"] = (
                max(0, int((plan_budget(limit) - fixed) / per_sample)) if per_sample > 0 else None
            )
            out["per_sample"], out["fixed"] = per_sample, fixed  # the largest batch's predicted peak
            mb = out["max_batch"]
            if mb is not None and 0 < mb < b and not obs.batchnorm:
                # the knob itself, simulated: the whole batch's input, output and its gradient come on top of
                # one micro-batch's step, so the line above alone would predict too little
                k = micro_batches(b, mb)
                try:
                    # the whole batch's share can still take K micro-batches over the limit: twice as many, twice
                    for _ in range(MICRO_DOUBLINGS + 1):
                        out["microbatches"] = k
                        out["microbatch_peak"], _ = _with_microbatches(k, lambda k=k: run(base_settings))
                        if out["microbatch_peak"] <= plan_budget(limit) or 2 * k > b or b % (2 * k):
                            break
                        k *= 2
                except Exception as exc:  # the rung keeps the plan's line; the reason is kept
                    out["microbatch_error"] = f"{type(exc).__name__}: {exc}"
        if precision == "fp32":
            out["bf16_peak"], _ = run(sim_settings_for(optimizer, "bf16-mixed", accum, device))
    # the optimizer's state is the question for its own cause, and also when the step's batch-independent part
    # (parameters, gradients, optimizer state) leaves no room for even one sample
    no_batch_fits = out.get("max_batch") == 0
    if (cause == "optimizer_state" or no_batch_fits) and optimizer.label.lower() not in ("none", "sgd"):
        # the rung says "SGD with momentum": price that (one buffer per parameter), not plain SGD (none)
        out["sgd_peak"], _ = run(
            sim_settings_for(OptimizerSpec.named("sgd-momentum"), precision, accum, device)
        )
    return out


def build_ladder(
    *,
    measured_peak: int,
    limit: int,
    plan: dict[str, Any] | None,
    cause: str,
    breakdown: dict[str, int],
    phase: str,
    growth: dict[str, Any] | None,
    fragmentation: dict[str, Any] | None,
    accumulating: bool = False,
    top_site: str | None = None,
) -> list[dict[str, Any]]:
    """The rungs, most relevant first; each has ``action``, ``saves`` (bytes or None), ``fits``, ``config``
    and ``peak``: the plan's peak with the rung applied (None for a rung the plan does not simulate), what
    ``scalpel run --memory-limit`` then measures.

    ``accumulating``: a backward ran since the last optimizer step (gradient accumulation), so
    gradients live at a forward peak are not left over from the previous step. ``top_site``: the call site
    holding the most when the limit was crossed (named by the data-preparation rung).
    """
    from torchscalpel.units import fmt_bytes

    rungs: list[dict[str, Any]] = []
    plan = plan or {}
    budget = plan_budget(limit)
    base_peak = plan.get("peak") or measured_peak

    def rung(
        kind: str,
        action: str,
        saves: int | None,
        *,
        fits: bool | None = None,
        config: dict[str, Any] | None = None,
        why: str = "",
        peak: int | None = None,
    ) -> None:
        if fits is None and saves is not None:
            fits = measured_peak - saves <= limit
        rungs.append(
            {
                "kind": kind,
                "action": action,
                "saves": saves,
                "fits": fits,
                "config": config or {},
                "why": why,
                "peak": None if peak is None else int(peak),
            }
        )

    if cause == "data_preparation":
        where = f" at {top_site}" if top_site else ""
        rung(
            "data-preparation",
            f"hold less while preparing the data{where}: build it in a smaller dtype "
            "(float32, uint8 images), per sample in a Dataset's __getitem__, or del intermediates before training",
            None,
            fits=None,
            why="the limit was crossed before the model's first training forward: no training-step "
            "setting (checkpointing, micro-batches, bf16) changes that peak",
        )

    if growth and growth.get("per_step"):
        kept = growth.get("kept")
        if kept:
            # what the growing sites hold beyond one step's worth is what stops growing: the kept graphs'
            # activations are only part of it (their inputs and outputs are counted at the same sites)
            beyond_one_step = sum(
                max(0, int(r["live"]) - int(r["per_step"])) for r in growth.get("sites") or []
            )
            saves = max(int(kept.get("activations") or 0), beyond_one_step)
            rung(
                "detach-kept",
                "keep plain numbers across steps: log loss.item() (or loss.detach()), and del outputs "
                "kept from an earlier step",
                saves,
                why="activations saved in earlier steps are still live: a tensor that requires grad outlives its step",
            )
        else:
            site = (growth.get("sites") or [{}])[0].get("site", "?")
            rung(
                "stop-growth",
                f"stop keeping tensors across steps at {site} (store .item() / .detach().cpu(), or "
                "bound the cache)",
                None,
                fits=None,
                why=f"grows {fmt_bytes(growth['per_step'])} per step",
            )
    if fragmentation and fragmentation.get("share", 0) > FRAGMENTATION_SHARE:
        rung(
            "expandable-segments",
            "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            fragmentation.get("reserved_free"),
            why=f"{fragmentation['share']:.0%} of reserved memory is free but fragmented",
        )
    if "checkpointed_peak" in plan:
        saves = max(0, base_peak - plan["checkpointed_peak"])
        rung(
            "checkpoint-blocks",
            f"activation checkpointing of the {plan.get('blocks')} repeated blocks",
            saves,
            fits=plan["checkpointed_peak"] <= budget,
            config={"checkpointing": "blocks"},
            peak=plan["checkpointed_peak"],
            why="recomputes each block's forward in backward (about one extra forward)",
        )
    batch, mb = plan.get("batch"), plan.get("max_batch")
    if batch and mb is not None and mb < batch:
        if mb > 0:
            k = plan.get("microbatches") or micro_batches(batch, mb)
            why = f"the plan's largest batch under the limit is {mb}"
            micro_peak = plan.get("microbatch_peak")  # the knob simulated (None: not simulated)
            max_peak = plan["fixed"] + plan["per_sample"] * mb if "per_sample" in plan else None
            if plan.get("batchnorm"):  # the knob refuses it: a script change with a BatchNorm caveat
                rung(
                    "micro-batches",
                    f"{k} micro-batches of {batch // k} with gradient accumulation in the script "
                    f"(global batch {batch} kept)",
                    None,
                    fits=None,
                    why=f"{why}; not applied by scalpel run: {plan['batchnorm'].split('; ran unsplit')[0]}",
                )
            else:
                rung(
                    "micro-batches",
                    f"{k} micro-batches of {batch // k} with gradient accumulation (global batch "
                    f"{batch} kept)",
                    None,
                    fits=True if micro_peak is None else micro_peak <= budget,
                    config={"microbatches": k},
                    why=why,
                    peak=micro_peak,
                )
            rung("max-batch", f"batch {mb} fits at most (from {batch})", None, fits=True, peak=max_peak)
        else:
            rung("max-batch", "not even batch 1 fits without other changes", None, fits=False)
    if "bf16_peak" in plan:
        rung(
            "bf16",
            "bf16 autocast",
            max(0, base_peak - plan["bf16_peak"]),
            fits=plan["bf16_peak"] <= plan_budget(limit, BF16_MARGIN),
            config={"amp": "bf16"},
            why="activations in half precision; fp32 master weights kept",
            peak=plan["bf16_peak"],
        )
    if "sgd_peak" in plan:
        rung(
            "optimizer",
            f"an optimizer with less state than {plan.get('optimizer')} (SGD with momentum keeps one "
            "buffer per parameter), or shard it (FSDP)",
            max(0, base_peak - plan["sgd_peak"]),
            fits=plan["sgd_peak"] <= budget,
            peak=plan["sgd_peak"],
        )
    # Gradients live in a forward are stale only when no backward ran since the last step: under gradient
    # accumulation the second micro-batch's forward holds the first one's gradients by design.
    if phase == "forward" and breakdown.get("gradients", 0) > 0 and not accumulating:
        rung(
            "set-to-none",
            "call optimizer.zero_grad(set_to_none=True) before the forward: the last step's gradients stay allocated through it",
            breakdown["gradients"],
        )
    if growth and growth.get("per_step"):
        # Memory that grows fills any limit in the end: every other rung (set-to-none included) only moves the out-of-memory later.
        for r in rungs:
            if r["kind"] not in ("detach-kept", "stop-growth"):
                r["fits"] = False
                r["why"] = (
                    r["why"] + "; " if r["why"] else ""
                ) + "only delays the out-of-memory while memory grows"
    order = {
        "activations": ("checkpoint-blocks", "micro-batches", "bf16", "max-batch"),
        "optimizer_state": ("optimizer",),
        "growth": ("detach-kept", "stop-growth"),
        "fragmentation": ("expandable-segments",),
        "data_preparation": ("data-preparation",),
        "gradients": ("set-to-none",),
    }.get(cause, ())
    # Rungs that fit first, the cause's own first among them: the first rung is the recommended fix (a
    # checkpointing rung that does not fit must not come before micro-batches that do: GPT-2 with a 16k vocab;
    # mnist's ladder put micro-batches and bf16 that did not fit before the smaller batch that did, when
    # max-batch was not one of the activations' rungs). ``fits`` compared by truth, not identity: a numpy
    # bool from a plan figure is as true as True.
    rungs.sort(
        key=lambda r: (
            r["fits"] is None or not bool(r["fits"]),
            r["kind"] not in order,
            order.index(r["kind"]) if r["kind"] in order else 0,
        )
    )
    return rungs

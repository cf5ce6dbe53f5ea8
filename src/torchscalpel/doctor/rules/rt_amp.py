"""Runtime mixed-precision rules: clipping scaled gradients, GradScaler skipping steps."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr


def _scaler_class() -> Any:
    from torch.amp.grad_scaler import GradScaler

    return GradScaler


def _stage_unscaled(scaler: Any, optimizer: Any) -> bool:
    """True when ``scaler.unscale_(optimizer)`` already ran in this iteration."""
    from torch.amp.grad_scaler import OptState

    state = (
        scaler._per_optimizer_states.get(id(optimizer)) if hasattr(scaler, "_per_optimizer_states") else None
    )
    return bool(state and state.get("stage") is OptState.UNSCALED)


CLIP_BEFORE_UNSCALE = RuleInfo(
    slug="clip-before-unscale",
    severity=Severity.ERROR,
    category="amp",
    summary="gradient clipping on scaled gradients (before scaler.unscale_)",
    kinds=("runtime",),
)


class ClipBeforeUnscale(RuntimeRule):
    """clip_grad_norm_/clip_grad_value_ called while a GradScaler's gradients are still scaled."""

    info = CLIP_BEFORE_UNSCALE

    def __init__(self) -> None:
        super().__init__()
        self.scalers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.events = 0
        self.clips = 0
        self.scale: float | None = None
        self.location: Location | None = None
        self._scaled: dict[int, bool] = {}
        self._unscaled: set[tuple[int, int]] = set()

    def setup(self) -> Undo:
        rule = self
        undos: list[Undo] = []
        Scaler = _scaler_class()

        # Call order per scaler: scale() ... unscale_(opt) ... update(). Tracked by hand so a scaler that
        # disabled itself (a CUDA script on a CPU machine) still shows the mistake in the code.
        def on_scale(scaler: Any) -> None:
            rule.scalers.add(scaler)
            rule._scaled[id(scaler)] = True

        def on_unscale(scaler: Any, optimizer: Any) -> None:
            rule._unscaled.add((id(scaler), id(optimizer)))

        def on_update(scaler: Any) -> None:
            rule._scaled[id(scaler)] = False
            rule._unscaled = {k for k in rule._unscaled if k[0] != id(scaler)}

        safe_scale, safe_unscale, safe_update = (
            self.safe(on_scale),
            self.safe(on_unscale),
            self.safe(on_update),
        )

        def make_scale(original: Callable[..., Any]) -> Callable[..., Any]:
            def scale(scaler: Any, outputs: Any) -> Any:
                safe_scale(scaler)
                return original(scaler, outputs)

            return scale

        def make_unscale(original: Callable[..., Any]) -> Callable[..., Any]:
            def unscale_(scaler: Any, optimizer: Any) -> Any:
                safe_unscale(scaler, optimizer)
                return original(scaler, optimizer)

            return unscale_

        def make_update(original: Callable[..., Any]) -> Callable[..., Any]:
            def update(scaler: Any, *args: Any, **kwargs: Any) -> Any:
                safe_update(scaler)
                return original(scaler, *args, **kwargs)

            return update

        undos.append(wrap_attr(Scaler, "scale", make_scale))
        undos.append(wrap_attr(Scaler, "unscale_", make_unscale))
        undos.append(wrap_attr(Scaler, "update", make_update))
        check = self.safe(self._check)

        def make_clip(original: Callable[..., Any]) -> Callable[..., Any]:
            def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
                params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                check(params)
                return original(params, *args, **kwargs)

            return clip

        import torch.nn.utils as nn_utils
        import torch.nn.utils.clip_grad as clip_mod

        for owner in (nn_utils, clip_mod):
            for name in ("clip_grad_norm_", "clip_grad_value_"):
                if hasattr(owner, name):
                    undos.append(wrap_attr(owner, name, make_clip))
        return undo_all(undos)

    def _check(self, params: list[torch.Tensor]) -> None:
        self.clips += 1
        ids = {id(p) for p in params}
        for scaler in list(self.scalers):
            if not self._scaled.get(id(scaler)):
                continue  # no scaled backward since the last update(): nothing to unscale
            for opt in list(getattr(self.session, "optimizers", ()) or ()):
                if not any(id(p) in ids for g in opt.param_groups for p in g["params"]):
                    continue
                if (id(scaler), id(opt)) not in self._unscaled and not _stage_unscaled(scaler, opt):
                    self.events += 1
                    self.scale = float(scaler.get_scale()) if scaler.is_enabled() else None
                    self.location = self.location or user_location()
                    return

    def findings(self, record: Any) -> Iterator[Finding]:
        if not self.events:
            return
        yield CLIP_BEFORE_UNSCALE.finding(
            "Gradients are clipped while still multiplied by the GradScaler's scale: the threshold is compared "
            "with scaled norms, so clipping is far too aggressive (or meaningless).",
            evidence=[
                f"{self.events} of {self.clips} clip call(s) ran before scaler.unscale_(optimizer); "
                + (
                    f"scale was {self.scale:g}"
                    if self.scale is not None
                    else "the scaler is disabled on this machine (no CUDA) but scales on a GPU"
                ),
                f"clipped at {fmt_loc(self.location)}",
            ],
            fix="scaler.scale(loss).backward()\nscaler.unscale_(optimizer)\n"
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\nscaler.step(optimizer)\nscaler.update()",
            location=self.location,
        )


SCALER_SKIPPED_STEPS = RuleInfo(
    slug="scaler-skipped-steps",
    severity=Severity.WARNING,
    category="amp",
    summary="GradScaler skipped optimizer steps",
    kinds=("runtime",),
)


class ScalerSkippedSteps(RuntimeRule):
    """GradScaler.step calls that skipped optimizer.step (inf/NaN gradients), and schedulers that advanced anyway."""

    info = SCALER_SKIPPED_STEPS

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.skipped = 0
        self.sched_after_skip = 0
        self.sched_steps = 0
        self._last_skipped = False
        self.scale: float | None = None
        self.location: Location | None = None

    def setup(self) -> Undo:
        rule = self
        Scaler = _scaler_class()

        def after_step(scaler: Any, optimizer: Any) -> None:
            if not scaler.is_enabled():  # a disabled scaler (no CUDA) never skips
                return
            state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer)) or {}
            found = state.get("found_inf_per_device") or {}
            skipped = bool(scaler.is_enabled()) and sum(float(v.item()) for v in found.values()) > 0
            rule.calls += 1
            rule._last_skipped = skipped
            if skipped:
                rule.skipped += 1
                rule.scale = float(scaler.get_scale())
                rule.location = rule.location or user_location()

        safe_after = self.safe(after_step)

        def make_step(original: Callable[..., Any]) -> Callable[..., Any]:
            def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
                out = original(scaler, optimizer, *args, **kwargs)
                safe_after(scaler, optimizer)
                return out

            return step

        def on_sched() -> None:
            rule.sched_steps += 1
            if rule._last_skipped:
                rule.sched_after_skip += 1
                rule._last_skipped = False

        safe_sched = self.safe(on_sched)

        def make_sched(original: Callable[..., Any]) -> Callable[..., Any]:
            def sched_step(sched: Any, *args: Any, **kwargs: Any) -> Any:
                safe_sched()
                return original(sched, *args, **kwargs)

            return sched_step

        from torch.optim.lr_scheduler import LRScheduler

        return undo_all([wrap_attr(Scaler, "step", make_step), wrap_attr(LRScheduler, "step", make_sched)])

    def findings(self, record: Any) -> Iterator[Finding]:
        if not self.skipped:
            return
        many = self.skipped >= max(3, 0.2 * self.calls)
        if not many and not self.sched_after_skip:
            return
        evidence = [
            f"{self.skipped} of {self.calls} scaler.step() calls skipped optimizer.step() (inf/NaN gradients); scale now {self.scale:g}"
        ]
        if self.sched_after_skip:
            evidence.append(f"the LR scheduler advanced on {self.sched_after_skip} skipped step(s) anyway")
        yield SCALER_SKIPPED_STEPS.finding(
            f"GradScaler skipped {self.skipped} optimizer step(s): those batches did not train the model"
            + (" while the LR schedule moved on." if self.sched_after_skip else "."),
            evidence=[*evidence, f"scaler.step at {fmt_loc(self.location)}"],
            fix="# persistent overflow: use bf16 autocast (no scaler needed) or find the op that overflows;\n"
            "scale_before = scaler.get_scale()\nscaler.step(optimizer); scaler.update()\n"
            "if scaler.get_scale() >= scale_before:   # the step was not skipped\n    scheduler.step()",
            location=self.location,
            severity=None if many else Severity.INFO,
        )

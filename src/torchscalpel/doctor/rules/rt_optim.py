"""Runtime optimizer rules: parameters no optimizer holds, frozen parameters still held, grads never cleared."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules import loop_static, manual_update
from torchscalpel.doctor.rules._common import fmt_loc, optimizer_params, param_names
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.patching import Undo, wrap_attr

_CHECK_STEPS = 5
"""Optimizer steps at which parameter coverage is checked (the first ones are enough)."""


def _optimizers(rule: RuntimeRule, extra: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    opts = list(getattr(rule.session, "optimizers", ()) or ())
    if extra not in opts:
        opts.append(extra)
    return opts


def _roots(rule: RuntimeRule) -> list[torch.nn.Module]:
    return list(getattr(rule.session, "root_modules", ()) or ())


PARAM_NOT_IN_OPTIMIZER = RuleInfo(
    slug="param-not-in-optimizer",
    severity=Severity.ERROR,
    category="model",
    summary="trainable parameters that receive gradients but no optimizer updates",
    kinds=("runtime",),
)


class ParamNotInOptimizer(RuntimeRule):
    """Parameters of the models that received gradients but that no optimizer holds."""

    info = PARAM_NOT_IN_OPTIMIZER

    def __init__(self) -> None:
        super().__init__()
        self.checks = 0
        self.missing: dict[str, int] = {}
        self.total_trainable = 0
        self.location: Location | None = None

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if self.checks >= _CHECK_STEPS:
            return
        self.checks += 1
        held = {id(p) for p in optimizer_params(_optimizers(self, optimizer))}
        names = None
        for root in _roots(self):
            trainable = [p for p in root.parameters() if p.requires_grad]
            self.total_trainable = max(self.total_trainable, sum(p.numel() for p in trainable))
            for p in trainable:
                if p.grad is not None and id(p) not in held:
                    names = names or param_names(_roots(self))
                    self.missing[names.get(id(p), f"<parameter {tuple(p.shape)}>")] = p.numel()
        if self.missing and self.location is None:
            self.location = user_location()

    def findings(self, record: Any) -> Iterator[Finding]:
        if not self.missing:
            return
        n = sum(self.missing.values())
        listed = ", ".join(list(self.missing)[:6]) + (" ..." if len(self.missing) > 6 else "")
        yield PARAM_NOT_IN_OPTIMIZER.finding(
            f"{len(self.missing)} trainable parameter tensor(s) receive gradients but no optimizer updates them.",
            evidence=[
                f"{n:,} of {self.total_trainable:,} trainable elements are missing from every optimizer: {listed}",
                f"seen at the optimizer step at {fmt_loc(self.location)}",
            ],
            fix="# build the optimizer after the model is complete, over all its parameters:\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=lr)\n"
            "# or add the missing ones: optimizer.add_param_group({'params': new_module.parameters()})",
            location=self.location,
        )


FROZEN_PARAM_IN_OPTIMIZER = RuleInfo(
    slug="frozen-param-in-optimizer",
    severity=Severity.WARNING,
    category="model",
    summary="requires_grad turned off after the optimizer was built",
    kinds=("runtime",),
)


class FrozenParamInOptimizer(RuntimeRule):
    """Parameters trainable when added to an optimizer whose requires_grad was turned off afterwards."""

    info = FROZEN_PARAM_IN_OPTIMIZER

    def __init__(self) -> None:
        super().__init__()
        self._at_add: dict[int, tuple[weakref.ref[torch.Tensor], bool]] = {}
        self.frozen: dict[str, bool] = {}
        self.location: Location | None = None

    def setup(self) -> Undo:
        rule = self

        def record(group: Any) -> None:
            params = group.get("params") if isinstance(group, dict) else None
            if params is None:
                return
            for p in [params] if isinstance(params, torch.Tensor) else list(params):
                if isinstance(p, torch.Tensor):
                    rule._at_add[id(p)] = (weakref.ref(p), p.requires_grad)

        safe_record = self.safe(record)

        def make(original: Any) -> Any:
            def add_param_group(opt: torch.optim.Optimizer, param_group: Any) -> Any:
                result = original(opt, param_group)
                safe_record(opt.param_groups[-1] if opt.param_groups else param_group)
                return result

            return add_param_group

        return wrap_attr(torch.optim.Optimizer, "add_param_group", make)

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        names = None
        for group in optimizer.param_groups:
            params: list[torch.Tensor] = group["params"]  # torch stores a group's parameters as a list
            for p in params:
                entry = self._at_add.get(id(p))
                if entry is None or entry[0]() is not p or not entry[1] or p.requires_grad:
                    continue
                names = names or param_names(_roots(self))
                name = names.get(id(p), f"<parameter {tuple(p.shape)}>")
                if name not in self.frozen:
                    self.frozen[name] = p.grad is not None
                    self.location = self.location or user_location()

    def findings(self, record: Any) -> Iterator[Finding]:
        if not self.frozen:
            return
        stale = sum(self.frozen.values())
        listed = ", ".join(list(self.frozen)[:6]) + (" ..." if len(self.frozen) > 6 else "")
        evidence = [
            f"{len(self.frozen)} parameter tensor(s) had requires_grad=True when the optimizer was built and False at its step: {listed}"
        ]
        if stale:
            evidence.append(
                f"{stale} of them still hold a gradient from before, so momentum/weight decay keep changing them"
            )
        yield FROZEN_PARAM_IN_OPTIMIZER.finding(
            "Parameters were frozen after the optimizer was built: the optimizer still holds them (and their "
            "state), and stale gradients or weight decay can still move them.",
            evidence=[*evidence, f"optimizer step at {fmt_loc(self.location)}"],
            fix="for p in frozen_module.parameters():\n    p.requires_grad_(False)\n"
            "# then build the optimizer over the trainable ones only:\n"
            "optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])",
            location=self.location,
        )


_SAMPLE_PARAMS = 16
_SAMPLE_ELEMS = 8


GRAD_NOT_ZEROED = RuleInfo(
    slug="grad-not-zeroed",
    severity=Severity.ERROR,
    category="loop",
    summary="gradients accumulate across optimizer steps (never cleared)",
    kinds=("runtime",),
)


class GradNotZeroed(RuntimeRule):
    """Gradients still holding the previous optimizer step's values when the next backward starts.

    After each ``optimizer.step()`` a few elements of a few gradients are remembered. At every later
    backward, gradients that are None or zero were cleared; gradients still equal to the remembered
    values were not. If an optimizer reaches its next step without its gradients ever having been
    seen cleared, gradients accumulated across steps. Correct accumulation (clearing right after each
    step taken every k micro-batches) never reaches that state.
    """

    info = GRAD_NOT_ZEROED

    def __init__(self) -> None:
        super().__init__()
        self._state: dict[int, dict[str, Any]] = {}
        self.steps_checked = 0
        self.events = 0
        self.location: Location | None = None

    def on_optimizer_step_post(self, optimizer: torch.optim.Optimizer) -> None:
        snap = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None or g.is_sparse or g.numel() == 0:
                    continue
                head = g.detach().reshape(-1)[:_SAMPLE_ELEMS].clone()
                if bool(head.any()):
                    snap.append((weakref.ref(p), head))
                if len(snap) >= _SAMPLE_PARAMS:
                    break
            if len(snap) >= _SAMPLE_PARAMS:
                break
        self._state[id(optimizer)] = {"snap": snap, "dirty": False, "cleared": False, "backward": False}

    def on_backward_pre(self, tensors: Any) -> None:
        for state in self._state.values():
            if state["cleared"] or not state["snap"]:
                continue
            same = cleared = 0
            for ref, head in state["snap"]:
                p = ref()
                if p is None:
                    continue
                g = p.grad
                if g is None:
                    cleared += 1
                    continue
                now = g.detach().reshape(-1)[:_SAMPLE_ELEMS]
                if not bool(now.any()):
                    cleared += 1
                elif now.shape == head.shape and torch.equal(now, head):
                    same += 1
            state["backward"] = True
            if cleared and cleared >= same:
                state["cleared"], state["dirty"] = True, False
            elif same > cleared:
                state["dirty"] = True

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        state = self._state.get(id(optimizer))
        if state is None or not state["snap"] or not state["backward"]:
            return
        self.steps_checked += 1
        if state["dirty"] and not state["cleared"]:
            self.events += 1
            if self.location is None:
                self.location = user_location()

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.events < 2:
            return
        yield GRAD_NOT_ZEROED.finding(
            "Gradients are never cleared between optimizer steps: each step applies the sum of all earlier "
            "gradients, so the effective learning rate keeps growing.",
            evidence=[
                f"at {self.events} of {self.steps_checked} optimizer steps, the gradients still held the previous "
                "step's values when the next backward started",
                f"optimizer step at {fmt_loc(self.location)}",
            ],
            fix="for x, y in loader:\n    optimizer.zero_grad(set_to_none=True)\n    loss = loss_fn(model(x), y)\n"
            "    loss.backward()\n    optimizer.step()",
            location=self.location,
        )


class ManualParameterUpdate(RuntimeRule):
    """Parameters that change between backward calls while no optimizer ever stepped: a hand-written update.

    Seen by the effect, whatever the spelling: a few elements of a few parameters are remembered at
    each backward; when they differ at the next one and no ``optimizer.step()`` ran in between, the
    script updated them itself. The static half points at the line.
    """

    info = loop_static.MANUAL_PARAMETER_UPDATE
    MIN_UPDATES = 2
    _PARAMS = 6

    def __init__(self) -> None:
        super().__init__()
        self._snap: list[tuple[weakref.ref[torch.Tensor], torch.Tensor]] = []
        self.updates = 0
        self.backwards = 0
        self.stepped = False
        self.location: Location | None = None
        """The user's line of the backward call before which the parameters were first seen changed: its file
        holds the loop, read for what the message says of the script."""

    def on_optimizer_step_post(self, optimizer: Any) -> None:
        self.stepped = True
        self._snap = []

    def on_backward_pre(self, tensors: Any) -> None:
        if self.stepped or getattr(self.session, "optimizers", None):
            return
        self.backwards += 1
        if self._snap and any(
            (p := ref()) is not None and not torch.equal(p.detach().reshape(-1)[:16], head)
            for ref, head in self._snap
        ):
            self.updates += 1
            if self.location is None:
                self.location = user_location()
        params = [p for root in _roots(self) for p in root.parameters() if p.requires_grad and p.numel()]
        params = params[:: max(1, len(params) // self._PARAMS)][: self._PARAMS]
        self._snap = [(weakref.ref(p), p.detach().reshape(-1)[:16].clone()) for p in params]

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.stepped or self.updates < self.MIN_UPDATES:
            return
        evidence = [
            f"parameters changed between {self.updates} of {self.backwards} consecutive backward calls "
            "without any optimizer.step()"
        ]
        # What the message says of the script is read from the file the backward ran in; never assumed.
        update = manual_update.first_in_file(self.location.file) if self.location is not None else None
        if update is not None:
            yield loop_static.MANUAL_PARAMETER_UPDATE.finding(
                manual_update.message(update, seen_running=True),
                evidence=evidence,
                fix=manual_update.fix(update),
                location=Location(file=self.location.file, line=update.line) if self.location else None,
            )
            return
        yield loop_static.MANUAL_PARAMETER_UPDATE.finding(
            "Parameters are updated by hand: they changed between backward calls and no optimizer exists. "
            "torch.optim does the same update in two lines, with momentum, weight decay and schedulers as "
            "options (the update was not found in the source where the backward ran, so nothing more is said of it).",
            evidence=evidence,
            fix=(
                "optimizer = torch.optim.SGD(params, lr=lr)  # params, lr: what the hand-written update uses\n"
                "optimizer.step()  # in place of the hand-written update\noptimizer.zero_grad()"
            ),
            location=self.location,
        )

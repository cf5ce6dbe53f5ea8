"""Training left in eval mode after an evaluation that never calls ``model.train()`` again.

The reverse of ``eval-in-train-mode`` (:mod:`~torchscalpel.doctor.rules.rt_graph`), with the same
machinery: root forwards as the runtime reports them and the dropout / batch-norm modules whose mode
matters (:func:`~torchscalpel.doctor.rules.rt_graph.norm_dropout_in_mode`). A model is *evaluated* when a
root forward of it runs without grad while training is expected (what the runtime takes as evaluation);
a later forward of that model with grad whose step reaches ``backward`` is a training step, and one run
while its dropout or batch-norm modules are in eval mode trains without dropout and with frozen
batch-norm statistics. ``Module.train`` is wrapped for the run so that the finding names the line that
put the model in eval mode (``model.eval()`` in the evaluation code), where ``model.train()`` belongs.

A model without dropout or batch-norm is never reported (its mode changes nothing), nor one whose
training forwards never follow an evaluation of it (a model trained in eval mode on purpose, from the
start). Lightning and the Hugging Face Trainer restore training mode themselves.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.rules.rt_graph import norm_dropout_in_mode
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.patching import Undo, wrap_attr


@dataclass(slots=True)
class _First:
    """The first training step seen in eval mode after an evaluation."""

    model: str
    modules: list[str]
    forward: Location | None
    eval_call: Location | None


TRAIN_IN_EVAL_MODE = RuleInfo(
    slug="train-in-eval-mode",
    severity=Severity.WARNING,
    category="loop",
    summary="training steps run with dropout/batch-norm left in eval mode after an evaluation",
    kinds=("runtime",),
)


class TrainInEvalMode(RuntimeRule):
    """Training steps whose model's dropout / batch-norm were left in eval mode by an evaluation."""

    info = TRAIN_IN_EVAL_MODE
    MIN_STEPS = 2
    """Training steps in eval mode before the rule reports (one could be a deliberate probe)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        self.first: _First | None = None
        self._evaluated: set[int] = set()
        self._eval_calls: dict[int, Location | None] = {}
        self._keys: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
        self._modules: dict[int, list[str]] = {}
        self._pending: _First | None = None
        self._depth = 0

    def setup(self) -> Undo:
        return wrap_attr(torch.nn.Module, "train", self._wrap_train)

    def _wrap_train(self, original: Callable[..., Any]) -> Callable[..., Any]:
        rule = self
        note = self.safe(self._note_mode)

        def train(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            # Module.train recurses into every child: only the outermost call is the user's.
            if rule._depth or torch.compiler.is_compiling():
                return original(module, *args, **kwargs)
            rule._depth += 1
            try:
                return original(module, *args, **kwargs)
            finally:
                rule._depth -= 1
                note(module, args[0] if args else kwargs.get("mode", True))

        return train

    def _note_mode(self, module: torch.nn.Module, mode: Any) -> None:
        if not mode:
            self._eval_calls[self._key(module)] = user_location()

    def _key(self, module: torch.nn.Module) -> int:
        """One key per model, whether it is called bare or through a wrapper (DDP, accelerate): its first
        parameter, which both share."""
        key = self._keys.get(module)
        if key is None:
            first = next(module.parameters(), None)
            key = id(first) if first is not None else id(module)
            self._keys[module] = key
        return key

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if not root:
            return
        if not torch.is_grad_enabled():
            if self.session is not None and self.session.training_expected():
                self._evaluated.add(self._key(module))
            return
        if module.training or not self._evaluated:
            return
        key = self._key(module)
        if key not in self._evaluated:
            return
        names = self._modules.get(key)
        if names is None:
            names = self._modules[key] = norm_dropout_in_mode(module, training=False)
        if names:
            self._pending = _First(type(module).__name__, names, user_location(), self._eval_calls.get(key))

    def on_backward_pre(self, tensors: Any) -> None:
        if self._pending is None:
            return
        self.steps += 1
        if self.first is None:
            self.first = self._pending
        self._pending = None

    def on_optimizer_step_post(self, optimizer: Any) -> None:
        self._pending = None  # a forward whose step ended without backward was no training step

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.first is None or self.steps < self.MIN_STEPS:
            return
        yield _finding(self.first, self.steps)


def _finding(first: _First, steps: int) -> Finding:
    """The one place this module builds its finding."""
    listed = ", ".join(first.modules[:5]) + (" ..." if len(first.modules) > 5 else "")
    where = first.eval_call or first.forward
    return TRAIN_IN_EVAL_MODE.finding(
        f"{first.model} trains in eval mode after an evaluation: the evaluation called model.eval() and nothing "
        "called model.train() before training resumed, so dropout is off and batch-norm uses frozen running "
        "statistics in the training steps that follow.",
        evidence=[
            f"{steps} training step(s) with a backward ran after an evaluation while {listed} were in eval mode",
            f"put in eval mode at {fmt_loc(first.eval_call)}; trained in eval mode at {fmt_loc(first.forward)}",
        ],
        fix="model.eval()\nwith torch.no_grad():\n    ...evaluate...\nmodel.train()  # back to training mode "
        "before the next training step (or call model.train() at the top of each epoch)",
        location=where,
    )

"""Runtime autograd-graph rules: graphs kept across steps, forwards whose graph is never used,
no-grad forwards with dropout/batch-norm still in training mode.

Graph lifetimes are observed with sentinels: a small object registered as a pre-hook on an
autograd node lives exactly as long as that node, and learns when a gradient flows through it.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.runtime_rules import RuntimeRule, iter_tensors, user_location
from torchscalpel.findings import Finding, Location, Severity


class _Use:
    """Whether a gradient reached a sentinel's nodes; kept by the rule, outliving the graph."""

    __slots__ = ("used",)

    def __init__(self) -> None:
        self.used = False


class _Sentinel:
    """Pre-hook on an autograd node: alive exactly as long as the node, marks ``use`` when a gradient arrives."""

    __slots__ = ("__weakref__", "use")

    def __init__(self, use: _Use) -> None:
        self.use = use

    def __call__(self, grad_outputs: Any) -> None:
        self.use.used = True


def _loss_nodes(t: torch.Tensor, depth: int = 2, exclude: set[int] = frozenset()) -> list[Any]:  # type: ignore[assignment]
    """The backward root's node and the nodes just below it (``depth`` levels, parameters' AccumulateGrad
    nodes excluded: they live as long as the model). The tensor a script keeps is often one step below
    the one backward ran on: ``(loss / accum).backward()`` or ``scaler.scale(loss).backward()`` while
    ``loss`` goes into a list."""
    root = t.grad_fn
    if root is None:
        return []
    nodes, frontier = [root], [root]
    for _ in range(depth - 1):
        nxt = []
        for node in frontier:
            for child, _ in getattr(node, "next_functions", ()):
                if (
                    child is not None
                    and type(child).__name__ != "AccumulateGrad"
                    and id(child) not in exclude
                    and len(nodes) < 8
                ):
                    nodes.append(child)
                    nxt.append(child)
        frontier = nxt
    return nodes


def _attach(
    tensors: list[torch.Tensor], use: _Use | None = None, nodes: list[Any] | None = None
) -> weakref.ref[_Sentinel] | None:
    """Register one sentinel on the distinct grad_fn nodes of ``tensors`` (or on ``nodes``); None if none has a graph."""
    sentinel = _Sentinel(use or _Use())
    attached = False
    seen: set[int] = set()
    for fn in nodes if nodes is not None else [t.grad_fn for t in tensors]:
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        try:
            fn.register_prehook(sentinel)
        except (RuntimeError, AttributeError):  # some nodes (e.g. from custom C++ ops) refuse hooks
            continue
        attached = True
    return weakref.ref(sentinel) if attached else None


LOSS_GRAPH_RETAINED = RuleInfo(
    slug="loss-graph-retained",
    severity=Severity.WARNING,
    category="loop",
    summary="loss/output tensors with autograd graphs kept alive across steps",
    kinds=("runtime",),
)


class LossGraphRetained(RuntimeRule):
    """Loss (and output) graphs from earlier steps that stay alive: something holds them."""

    info = LOSS_GRAPH_RETAINED

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self._losses: list[tuple[int, weakref.ref[_Sentinel]]] = []
        self._outputs: list[tuple[int, weakref.ref[_Sentinel]]] = []
        self.alive_history: list[tuple[int, int, int]] = []
        self.outputs_history: list[tuple[int, int, int]] = []
        self.location: Location | None = None
        self._last_loss_loc: Location | None = None
        self._recent_nodes: set[int] = set()
        self._optimizer_seen = False

    def on_backward_pre(self, tensors: Any) -> None:
        if not tensors:
            return
        if not isinstance(tensors[0], torch.Tensor):
            return
        # A node below the root that an earlier backward also reached is shared between steps (a
        # tensor built once, before the loop): it would keep every step's sentinel alive.
        nodes = _loss_nodes(tensors[0], exclude=self._recent_nodes)
        self._recent_nodes = {id(n) for n in nodes[1:]} | {
            id(c) for c, _ in getattr(tensors[0].grad_fn, "next_functions", ()) if c is not None
        }
        ref = _attach([], nodes=nodes)
        if ref is not None:
            self._losses.append((self.step, ref))
            if len(self._losses) <= 2:
                self._last_loss_loc = user_location()

    def on_forward_post(
        self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any, root: bool
    ) -> None:
        if root and torch.is_grad_enabled() and module.training:
            ref = _attach([t for t in iter_tensors(output, limit=4) if t.grad_fn is not None])
            if ref is not None:
                self._outputs.append((self.step, ref))

    def _count(
        self, entries: list[tuple[int, weakref.ref[_Sentinel]]], history: list[tuple[int, int, int]]
    ) -> list[tuple[int, weakref.ref[_Sentinel]]]:
        old = [(s, r) for s, r in entries if s <= self.step - 3]
        alive = sum(1 for _, r in old if r() is not None)
        history.append((self.step, alive, len(old)))
        # Forget old entries that died (they can never come back), keep the rest.
        return [(s, r) for s, r in entries if r() is not None or s > self.step - 3]

    def on_optimizer_step_post(self, optimizer: Any) -> None:
        self._optimizer_seen = True
        self._tick()

    def on_step_end(self, step: Any) -> None:
        # Without any optimizer (a hand-written SGD loop) the runtime's backward-delimited steps count.
        if not self._optimizer_seen and not getattr(self.session, "optimizers", None):
            self._tick()

    def _tick(self) -> None:
        self.step += 1
        self._losses = self._count(self._losses, self.alive_history)
        self._outputs = self._count(self._outputs, self.outputs_history)
        if (self.alive_history[-1][1] or self.outputs_history[-1][1]) and self.location is None:
            self.location = self._last_loss_loc

    @staticmethod
    def _retained(history: list[tuple[int, int, int]]) -> tuple[int, int, int] | None:
        """The worst moment of the run: the step at which most old graphs were alive, if it counts.

        Any step counts, not only the last: a list reset each epoch (``epoch_losses = []``) may
        have just been emptied when the window ends."""
        hits = [h for h in history if h[1] >= 3 and h[1] >= 0.5 * h[2]]
        return max(hits, key=lambda h: h[1]) if hits else None

    def findings(self, record: Any) -> Iterator[Finding]:
        losses, outputs = self._retained(self.alive_history), self._retained(self.outputs_history)
        if not (losses or outputs):
            return
        history = self.alive_history if losses else self.outputs_history
        step, alive, old = losses or outputs  # type: ignore[misc]
        peak = max(a for _, a, _ in history)
        yield LOSS_GRAPH_RETAINED.finding(
            f"{'Loss tensors' if losses else 'Model outputs'} from earlier steps are still alive with their autograd "
            "graphs: memory grows every step (typically `total += loss` or `outputs.append(out)` without "
            ".item()/.detach()).",
            evidence=[
                f"after step {step}, the graphs of {alive} of the {old} {'losses' if losses else 'model outputs'} "
                f"from 3+ steps earlier were still alive (peak {peak})",
                f"backward called at {fmt_loc(self.location)}",
            ],
            fix="running_loss += loss.item()      # a Python float, no graph\n"
            "history.append(loss.detach())   # or keep a detached tensor",
            location=self.location,
        )


EVAL_WITHOUT_NO_GRAD = RuleInfo(
    slug="eval-without-no-grad",
    severity=Severity.WARNING,
    category="loop",
    summary="forward passes whose autograd graph is never used",
    kinds=("runtime",),
)


class EvalWithoutNoGrad(RuntimeRule):
    """Root forward passes built with autograd on whose graph no backward ever used.

    A forward is settled as unused when a backward that runs after a later optimizer step still has
    not reached its graph (so a generator output consumed one step later, as in GANs, is not flagged),
    or when the script completes without any backward reaching it.
    """

    info = EVAL_WITHOUT_NO_GRAD

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self._pending: list[tuple[_Use, int, str, bool, tuple[str, int] | None]] = []
        self.used = 0
        self.unused: Counter[tuple[str, bool]] = Counter()
        self.unused_locations: Counter[tuple[str, int]] = Counter()

    def on_forward_post(
        self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any, root: bool
    ) -> None:
        if not root or not torch.is_grad_enabled():
            return
        tensors = [t for t in iter_tensors(output, limit=8) if t.grad_fn is not None]
        if not tensors:
            return
        use = _Use()
        if _attach(tensors, use) is None:
            return
        loc = user_location()
        self._pending.append(
            (use, self.step, type(module).__name__, module.training, (loc.file, loc.line) if loc else None)
        )

    def _settle(self, *, final: bool = False) -> None:
        keep = []
        for entry in self._pending:
            use, step, name, training, loc = entry
            if use.used:
                self.used += 1
            elif final or self.step > step:
                self.unused[(name, training)] += 1
                if loc:
                    self.unused_locations[loc] += 1
            else:
                keep.append(entry)
        self._pending = keep

    def on_optimizer_step_post(self, optimizer: Any) -> None:
        self.step += 1

    def on_backward_post(self, tensors: Any) -> None:
        self._settle()

    def on_finish(self, record: Any) -> None:
        self._settle(final=getattr(record, "status", "") == "complete")

    def findings(self, record: Any) -> Iterator[Finding]:
        total = sum(self.unused.values())
        if total < 2:
            return
        loc = None
        if self.unused_locations:
            (file, line), _ = self.unused_locations.most_common(1)[0]
            loc = Location(file=file, line=line)
        what = ", ".join(
            f"{n} call(s) of {name} in {'train' if training else 'eval'} mode"
            for (name, training), n in self.unused.most_common(3)
        )
        yield EVAL_WITHOUT_NO_GRAD.finding(
            "Forward passes build autograd graphs that no backward ever uses (evaluation without torch.no_grad): "
            "activations are kept for nothing, costing memory and time.",
            evidence=[
                f"{total} forward pass(es) whose graph was freed unused: {what}",
                f"{self.used} forward pass(es) were backpropagated",
                f"called at {fmt_loc(loc)}",
            ],
            fix="model.eval()\nwith torch.inference_mode():   # or torch.no_grad()\n    logits = model(x)",
            location=loc,
        )


def norm_dropout_in_mode(module: torch.nn.Module, *, training: bool = True) -> list[str]:
    """Names of dropout (p > 0) and batch-norm submodules of ``module`` whose mode is ``training``: the
    modules whose behaviour train/eval mode changes (``eval-in-train-mode`` asks for those still training,
    ``train-in-eval-mode`` for those left in eval mode)."""
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd

    out = []
    for name, m in module.named_modules():
        if m.training != training:
            continue
        if (isinstance(m, _DropoutNd) and m.p > 0) or isinstance(m, _BatchNorm):
            out.append(f"{name or type(m).__name__} ({type(m).__name__})")
    return out


EVAL_IN_TRAIN_MODE = RuleInfo(
    slug="eval-in-train-mode",
    severity=Severity.WARNING,
    category="loop",
    summary="forward under no_grad/inference_mode with dropout or batch-norm in training mode",
    kinds=("runtime",),
)


class EvalInTrainMode(RuntimeRule):
    """Root forwards under no_grad/inference_mode while dropout or batch-norm is in training mode."""

    info = EVAL_IN_TRAIN_MODE

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.modules: list[str] = []
        self.model = ""
        self.location: Location | None = None

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if not root or torch.is_grad_enabled():
            return
        names = norm_dropout_in_mode(module)
        if not names:
            return
        self.calls += 1
        if not self.modules:
            self.modules, self.model = names, type(module).__name__
            self.location = user_location()

    def findings(self, record: Any) -> Iterator[Finding]:
        if not self.calls:
            return
        listed = ", ".join(self.modules[:5]) + (" ..." if len(self.modules) > 5 else "")
        yield EVAL_IN_TRAIN_MODE.finding(
            f"{self.model} runs under no_grad/inference_mode with dropout/batch-norm still in training mode: "
            "evaluation is noisy and batch-norm running statistics are overwritten by evaluation data.",
            evidence=[
                f"{self.calls} no-grad forward call(s) with training-mode modules: {listed}",
                f"called at {fmt_loc(self.location)}",
            ],
            fix="model.eval()\nwith torch.no_grad():\n    ...evaluate...\nmodel.train()  # before training resumes",
            location=self.location,
        )

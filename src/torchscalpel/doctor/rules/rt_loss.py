"""Runtime loss rules: probabilities given to a loss that wants logits, and a loss that does not fit the task.

Both wrap the loss functions of ``torch.nn.functional`` for the run (``nn.CrossEntropyLoss``,
``nn.BCEWithLogitsLoss``, ``nn.MSELoss`` ... call them too, so module losses are seen the same way)
and read what the user passed:

- ``softmax-before-cross-entropy``: the autograd node that produced the loss's *input* (through
  views and casts) is ``SoftmaxBackward0`` / ``LogSoftmaxBackward0`` for ``cross_entropy`` (which
  applies log-softmax itself), ``SoftmaxBackward0`` for ``nll_loss`` (which wants log-probabilities)
  or ``SigmoidBackward0`` for ``binary_cross_entropy_with_logits``. The graph says what the tensor
  is, whatever the code that built it is called.
- ``loss-task-mismatch``: the *targets* of the first calls say what the task is: class indices
  (integers above 1) or one-hot rows given to a binary cross-entropy, class indices or one-hot rows
  given to ``mse_loss``, and targets that broadcast against the prediction.

Only the first few calls read tensor values (a device sync on a GPU), so the cost is bounded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.runtime_rules import RuntimeRule, iter_tensors, user_location
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr

# Autograd nodes that only reshape, select or cast their input: the tensor below them is the same values.
_PASS_THROUGH = re.compile(
    r"(View|UnsafeView|ReshapeAlias|Squeeze\w*|Unsqueeze\w*|Permute|Transpose\w*|T|Expand|Slice|Select\w*|"
    r"Clone|ToCopy|Alias|AsStrided|Narrow\w*|Unbind|Split\w*|Index|Flatten\w*|Contiguous)Backward\d*"
)
_MAX_WALK = 16


def producer(tensor: Any) -> str | None:
    """The name of the autograd node that made ``tensor``'s values, past views and casts (None without one)."""
    node = getattr(tensor, "grad_fn", None)
    for _ in range(_MAX_WALK):
        if node is None:
            return None
        name = type(node).__name__
        if not _PASS_THROUGH.fullmatch(name):
            return name
        nxt = [n for n, _ in node.next_functions if n is not None]
        node = nxt[0] if nxt else None
    return None


# loss function -> (the producer node it must not get, what the tensor then is, what the loss expects)
_WRONG_INPUT: dict[str, tuple[tuple[str, str, str, Severity], ...]] = {
    "cross_entropy": (
        (
            "SoftmaxBackward0",
            "softmax probabilities",
            "cross_entropy applies log_softmax itself, so the model is trained on softmax(softmax(x)): the "
            "loss cannot fall below a floor and the gradients shrink as the model grows confident",
            Severity.ERROR,
        ),
        (
            "LogSoftmaxBackward0",
            "log_softmax output",
            "cross_entropy applies log_softmax again: the value is the same, but the model output is "
            "already log-probabilities, which is what nll_loss takes (a second log_softmax every step)",
            Severity.WARNING,
        ),
    ),
    "nll_loss": (
        (
            "SoftmaxBackward0",
            "softmax probabilities",
            "nll_loss takes log-probabilities: on probabilities it maximises p itself, not log p, and "
            "the loss is negative and flat near the answer",
            Severity.ERROR,
        ),
    ),
    "binary_cross_entropy_with_logits": (
        (
            "SigmoidBackward0",
            "sigmoid probabilities",
            "binary_cross_entropy_with_logits applies sigmoid itself, so the model is trained on "
            "sigmoid(sigmoid(x)), which never goes below 0.5 or above 0.73",
            Severity.ERROR,
        ),
    ),
}
_FIXES = {
    "cross_entropy": (
        "# return raw logits from the model (no softmax) and let the loss apply log_softmax:\n"
        "logits = model(x)                      # not F.softmax(model(x), dim=-1)\n"
        "loss = F.cross_entropy(logits, y)\n"
        "probs = logits.softmax(-1)             # only where probabilities are needed (metrics, inference)"
    ),
    "nll_loss": "loss = F.nll_loss(F.log_softmax(logits, dim=-1), y)  # or F.cross_entropy(logits, y)",
    "binary_cross_entropy_with_logits": (
        "logits = model(x)                      # no torch.sigmoid before the loss\n"
        "loss = F.binary_cross_entropy_with_logits(logits, y)"
    ),
}
_ACTIVATIONS = {"SoftmaxBackward0", "LogSoftmaxBackward0", "SigmoidBackward0"}


@dataclass(slots=True)
class _Seen:
    """One wrong input as first seen: where the loss was computed and which module gave the tensor."""

    fn: str
    node: str
    location: Location | None
    origin: str | None
    count: int = 0


SOFTMAX_BEFORE_CROSS_ENTROPY = RuleInfo(
    slug="softmax-before-cross-entropy",
    severity=Severity.ERROR,
    category="loop",
    summary="softmax/log_softmax before cross_entropy (or sigmoid before BCE with logits): the loss applies it again",
    kinds=("runtime",),
)


class SoftmaxBeforeCrossEntropy(RuntimeRule):
    """Probabilities given to a loss that applies softmax/sigmoid itself (cross_entropy, BCE with logits),
    or softmax probabilities given to nll_loss."""

    info = SOFTMAX_BEFORE_CROSS_ENTROPY

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[str, str], _Seen] = {}
        # id(grad_fn) of a module output that is an activation -> the module's name, for the evidence
        self._origins: dict[int, str] = {}

    def setup(self) -> Undo:
        undos: list[Undo] = []
        for name in _WRONG_INPUT:
            undos.append(wrap_attr(torch.nn.functional, name, self._make(name)))
        return undo_all(undos)

    def _make(self, fn: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        check = self.safe(self._check)

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(input: Any, *args: Any, **kwargs: Any) -> Any:
                # first thing: under torch.compile the check would be traced (graph breaks on grad_fn)
                if not torch.compiler.is_compiling():
                    check(fn, input)
                return original(input, *args, **kwargs)

            return wrapper

        return make

    def _check(self, fn: str, input: Any) -> None:
        node = producer(input)
        if node is None:
            return
        for bad, *_ in _WRONG_INPUT[fn]:
            if node == bad:
                key = (fn, node)
                if key not in self.seen:
                    self.seen[key] = _Seen(fn, node, user_location(), None)
                seen = self.seen[key]
                seen.count += 1
                if seen.origin is None:  # the first forward may not be reported yet: ask again later
                    seen.origin = self._origins.get(id(getattr(input, "grad_fn", None)))

    def on_forward_post(self, module: Any, args: Any, kwargs: Any, output: Any, root: bool) -> None:
        if len(self._origins) > 64:
            self._origins.clear()
        for t in iter_tensors(output, limit=2):
            node = t.grad_fn
            if node is not None and type(node).__name__ in _ACTIVATIONS and id(node) not in self._origins:
                # the innermost module that returned it reports first (nn.Softmax inside a Sequential)
                name = type(module).__name__
                torch_layer = (type(module).__module__ or "").startswith("torch.")
                self._origins[id(node)] = (
                    f"the output of an nn.{name} layer" if torch_layer else f"the output of {name}.forward"
                ) + ("" if torch_layer else _where(module))

    def on_step_end(self, step: Any) -> None:
        self._origins.clear()  # ids of freed nodes may be reused: keep only this step's

    def findings(self, record: Any) -> Iterator[Finding]:
        for seen in self.seen.values():
            what, why, severity = next((w, y, s) for b, w, y, s in _WRONG_INPUT[seen.fn] if b == seen.node)
            evidence = [
                f"{seen.fn} was called {seen.count} time(s) on {what} (its input was made by {seen.node})",
            ]
            if seen.origin:
                evidence.append(f"that input is {seen.origin}")
            if seen.location is not None:
                evidence.append(f"loss computed at {fmt_loc(seen.location)}")
            yield SOFTMAX_BEFORE_CROSS_ENTROPY.finding(
                f"{seen.fn} is given {what}: {why}.",
                evidence=evidence,
                fix=_FIXES[seen.fn],
                location=seen.location,
                severity=severity,
            )


def _where(module: Any) -> str:
    """`` (file:line)`` of the module's forward when it is the user's code, else ``""``."""
    import inspect

    from torchscalpel.runtime.userframes import is_user_file

    try:
        fwd = type(module).forward
        file = inspect.getsourcefile(fwd)
        lines, start = inspect.getsourcelines(fwd)
    except (OSError, TypeError):
        return ""
    if not file or not is_user_file(file):
        return ""
    for offset, line in enumerate(lines):
        if re.search(r"softmax|sigmoid", line, flags=re.I):
            return f" ({fmt_loc(Location(file=file, line=start + offset))}: {line.strip()})"
    return f" ({fmt_loc(Location(file=file, line=start))})"


_CHECKED_CALLS = 8
"""Calls per loss function whose targets are read (a device sync each on a GPU): the first ones say it."""
_SAMPLE = 4096


@dataclass(slots=True)
class _Mismatch:
    kind: str
    fn: str
    location: Location | None
    detail: str
    count: int = 0
    calls: int = 0


@dataclass(slots=True)
class _Targets:
    calls: int = 0
    onehot_rows: int = 0
    other_rows: int = 0
    shapes: set[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=set)
    kind: str | None = None
    """What the whole-number targets were: an integer dtype, or an integer tensor of the batch cast to float."""
    integer_calls: int = 0
    """Calls whose (non one-hot) targets were all whole numbers."""
    values: set[int] = field(default_factory=set)
    """Their distinct values (up to 101)."""


def _integer_valued(t: torch.Tensor) -> bool:
    if not t.is_floating_point():
        return t.dtype not in (torch.bool, torch.complex64, torch.complex128)
    return bool(torch.equal(t, t.round()))


def _onehot(pred: torch.Tensor, target: torch.Tensor) -> tuple[int, int]:
    """(one-hot rows, other rows) of ``target`` when it has the prediction's shape and a class dim > 1."""
    if target.dim() < 2 or target.shape != pred.shape or target.shape[-1] < 2:
        return 0, 0
    rows = target.reshape(-1, target.shape[-1])[: _SAMPLE // max(1, target.shape[-1]) + 1].float()
    binary = ((rows == 0) | (rows == 1)).all(dim=-1)
    single = binary & (rows.sum(dim=-1) == 1)
    n = int(single.sum())
    return n, rows.shape[0] - n


LOSS_TASK_MISMATCH = RuleInfo(
    slug="loss-task-mismatch",
    severity=Severity.WARNING,
    category="loop",
    summary="a loss that does not fit the targets: BCE on class indices or one-hot multi-class, MSE on class indices",
    kinds=("runtime",),
)


class LossTaskMismatch(RuntimeRule):
    """A binary or regression loss given class indices or single-label one-hot rows, or targets that broadcast."""

    info = LOSS_TASK_MISMATCH
    FUNCTIONS = ("binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss", "l1_loss")
    MIN_ONEHOT_ROWS = 64
    """Single-label one-hot rows (and no other row) seen before calling the task multi-class: a multi-label
    dataset has rows with 0 or several labels well before 64."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[tuple[str, str], _Mismatch] = {}
        self.targets: dict[str, _Targets] = {}
        self.locations: dict[str, Location | None] = {}
        self._batch_ints: list[torch.Tensor] = []

    def setup(self) -> Undo:
        return undo_all([wrap_attr(torch.nn.functional, name, self._make(name)) for name in self.FUNCTIONS])

    def _make(self, fn: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        check = self.safe(self._check)

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(input: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
                if not torch.compiler.is_compiling():  # as above: never traced by torch.compile
                    check(fn, input, target)
                return original(input, target, *args, **kwargs)

            return wrapper

        return make

    def on_batch(self, batch: Any, loader: Any) -> None:
        # Integer tensors of the latest batch: a float target equal to one of them is a cast label.
        self._batch_ints = [
            t for t in iter_tensors(batch, limit=8) if not t.is_floating_point() and t.dtype != torch.bool
        ]

    def _note(self, kind: str, fn: str, detail: str) -> None:
        key = (fn, kind)
        if key not in self.found:
            self.found[key] = _Mismatch(kind, fn, self.locations.get(fn), detail)
        self.found[key].count += 1

    def _check(self, fn: str, pred: Any, target: Any) -> None:
        if not isinstance(pred, torch.Tensor) or not isinstance(target, torch.Tensor):
            return
        if not torch.is_grad_enabled() or pred.grad_fn is None:
            return  # evaluation: the training loss is what says the task
        state = self.targets.setdefault(fn, _Targets())
        if state.calls >= _CHECKED_CALLS:
            return
        state.calls += 1
        if fn not in self.locations:
            self.locations[fn] = user_location()
        if target.shape != pred.shape:
            state.shapes.add((tuple(pred.shape), tuple(target.shape)))
        with torch.no_grad():
            flat = target.detach().reshape(-1)[:_SAMPLE]
            if flat.numel() == 0:
                return
            integer = _integer_valued(flat)
            top = float(flat.max()) if integer else 0.0
            if fn.startswith("binary_cross_entropy"):
                if integer and top > 1:
                    self._note(
                        "bce-class-indices",
                        fn,
                        f"targets are integers up to {top:.0f}: class indices, but {fn} scores each "
                        "element as a probability in [0, 1]",
                    )
                    return
                one, other = _onehot(pred, target.detach())
                state.onehot_rows += one
                state.other_rows += other
                return
            # mse_loss / l1_loss
            if target.shape != pred.shape:
                try:
                    both = torch.broadcast_shapes(pred.shape, target.shape)
                except RuntimeError:  # torch raises on the call itself
                    both = None
                if both is not None and both.numel() > max(pred.numel(), target.numel()):
                    self._note(
                        "broadcast",
                        fn,
                        f"prediction {list(pred.shape)} and target {list(target.shape)} broadcast to "
                        f"{list(both)}: every prediction is compared with every target",
                    )
            if not target.is_floating_point() and target.dtype != torch.bool:
                state.kind = f"{str(target.dtype).removeprefix('torch.')} targets"
            one, other = _onehot(pred, target.detach())
            state.onehot_rows += one
            state.other_rows += other
            if integer and not one and not other:
                # judged at the end, on the values of every checked call: class indices are 0 .. K-1
                state.integer_calls += 1
                if len(state.values) <= 100:
                    state.values.update(int(v) for v in torch.unique(flat)[:101].tolist())
                if state.kind is None and self._cast_label(flat):
                    state.kind = "integer labels of the batch cast to float"

    def _cast_label(self, flat: torch.Tensor) -> bool:
        """True when ``flat`` equals an integer tensor of the current batch with few distinct values."""
        for t in self._batch_ints:
            if t.numel() and t.reshape(-1)[: flat.numel()].numel() == flat.numel():
                ints = t.reshape(-1)[: flat.numel()]
                if torch.equal(ints.to(flat.dtype), flat) and int(ints.min()) >= 0:
                    return len(torch.unique(ints)) <= 100
        return False

    def findings(self, record: Any) -> Iterator[Finding]:
        for fn, state in self.targets.items():
            if (
                state.onehot_rows >= self.MIN_ONEHOT_ROWS
                and state.other_rows == 0
                and (fn, "bce-class-indices") not in self.found
            ):
                kind = "onehot-bce" if fn.startswith("binary") else "onehot-regression"
                self.found[(fn, kind)] = _Mismatch(
                    kind,
                    fn,
                    self.locations.get(fn),
                    f"every target row ({state.onehot_rows} checked) is one-hot: exactly one class is right",
                    count=state.calls,
                )
            values = sorted(state.values)
            # an integer dtype says "labels" by itself (2 classes are enough); whole-number floats need 3+
            fewest = 2 if state.kind and state.kind.endswith(" targets") else 3
            if (
                not fn.startswith("binary")
                and state.integer_calls == state.calls
                and fewest <= len(values) <= 100
                and values == list(range(len(values)))  # 0 .. K-1: ratings 1..5 or prices are regression
            ):
                self.found[(fn, "regression-class-indices")] = _Mismatch(
                    "regression-class-indices",
                    fn,
                    self.locations.get(fn),
                    f"every target is one of the {len(values)} whole numbers 0 .. {values[-1]}"
                    + (f" ({state.kind})" if state.kind else ""),
                    count=state.calls,
                )
        for m in self.found.values():
            yield self._finding(m, self.targets.get(m.fn))

    def _finding(self, m: _Mismatch, state: _Targets | None) -> Finding:
        where = [f"loss computed at {fmt_loc(m.location)}"] if m.location else []
        checked = state.calls if state else m.count
        evidence = [f"{m.detail} (seen in {m.count or checked} of the first {checked} call(s))", *where]
        if m.kind == "bce-class-indices":
            message = (
                f"{m.fn} is given class indices as targets: the task is multi-class, the loss is binary."
            )
            fix = (
                "# one output per class and cross-entropy on the class indices:\n"
                "model.head = nn.Linear(d, num_classes)\nloss = F.cross_entropy(logits, y.long())"
            )
            severity = Severity.ERROR
        elif m.kind == "onehot-bce":
            message = (
                f"{m.fn} is trained on one-hot rows of a single-label task: each class is scored on its own, "
                "so the probabilities need not sum to 1 and the loss is dominated by the many negatives."
            )
            fix = "loss = F.cross_entropy(logits, y_onehot.argmax(-1))  # or keep the class indices: F.cross_entropy(logits, y)"
            severity = Severity.WARNING
        elif m.kind == "broadcast":
            message = f"{m.fn}'s prediction and target have different shapes and broadcast: the loss is not per sample."
            fix = "loss = F.mse_loss(pred.squeeze(-1), target)  # make the shapes equal (pred [N, 1] vs target [N])"
            severity = Severity.ERROR
        elif m.kind == "onehot-regression":
            message = (
                f"{m.fn} regresses one-hot class rows: a classification task trained as regression "
                "(slow to learn, scores are not probabilities)."
            )
            fix = "loss = F.cross_entropy(logits, y)  # y: class indices; logits: one output per class"
            severity = Severity.WARNING
        else:  # regression-class-indices
            message = (
                f"{m.fn} is given class indices as targets: a classification task trained as regression "
                "(class 3 is not 'closer' to 2 than to 9). If the targets really are numbers (counts, "
                "ratings), ignore this."
            )
            fix = (
                "model.head = nn.Linear(d, num_classes)   # one output per class\n"
                "loss = F.cross_entropy(logits, y.long())"
            )
            severity = Severity.WARNING
        return LOSS_TASK_MISMATCH.finding(
            message, evidence=evidence, fix=fix, location=m.location, severity=severity
        )

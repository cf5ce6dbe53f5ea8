"""Data sanity on the labels of the first classification losses: labels outside the model's output width,
and training batches that each hold one class.

``cross_entropy`` and ``nll_loss`` are wrapped for the run (``nn.CrossEntropyLoss`` / ``nn.NLLLoss`` and
Hugging Face models call them too); the first :data:`LabelChecks.CHECKED` calls with integer class targets
are read *before* the loss runs, so the finding exists even when the loss then crashes (on a CPU,
"Target 10 is out of bounds"; on a GPU, a device-side assert far from the cause). Targets equal to the
call's ``ignore_index`` (-100 by default: padding) are not labels.

- ``label-out-of-range``: a label below 0 or at or above the number of classes the model outputs (the
  class dimension of the loss's input);
- ``batch-one-class``: each of the first :data:`ONE_CLASS_BATCHES` training batches of at least
  :data:`MIN_LABELS` labels holds a single class, and either other classes appear in the batches read after
  them (a dataset sorted by class and read in order) or the model has 3 or more outputs (labels all set to
  one value); a binary task whose rare class is missing from the first batches is not reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.runtime_rules import RuntimeRule, user_location
from torchscalpel.findings import Finding, Location, Severity
from torchscalpel.runtime.patching import Undo, undo_all, wrap_attr

ONE_CLASS_BATCHES = 3
MIN_LABELS = 8
_IGNORE_AT = 4
"""``ignore_index``'s position among ``cross_entropy`` / ``nll_loss``'s positional parameters."""

OUT_OF_RANGE = RuleInfo(
    slug="label-out-of-range",
    severity=Severity.ERROR,
    category="data",
    summary="class labels outside the model's output width",
    kinds=("runtime",),
)
ONE_CLASS = RuleInfo(
    slug="batch-one-class",
    severity=Severity.WARNING,
    category="data",
    summary="training batches that each hold a single class",
    kinds=("runtime",),
)


@dataclass(slots=True)
class _Range:
    low: int
    high: int
    width: int
    fn: str
    location: Location | None
    batch: Location | None


class LabelChecks(RuntimeRule):
    """The two checks of the module docstring, on the first classification losses' targets."""

    infos = (OUT_OF_RANGE, ONE_CLASS)
    FUNCTIONS = ("cross_entropy", "nll_loss")
    CHECKED = 8
    """Loss calls whose targets are read."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = 0
        self.out_of_range: _Range | None = None
        self.one_class: list[int] = []
        """The class of each training batch read (-1 for a batch of several)."""
        self.seen: set[int] = set()
        """Labels seen over the training batches read (the first 16)."""
        self.width = 0
        self.labels = 0
        self.one_class_location: Location | None = None
        self._batch: Location | None = None

    def setup(self) -> Undo:
        return undo_all([wrap_attr(torch.nn.functional, name, self._make(name)) for name in self.FUNCTIONS])

    def _make(self, fn: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        check = self.safe(self._check)
        rule = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(input: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
                if rule.checked < rule.CHECKED and not torch.compiler.is_compiling():
                    ignore = kwargs.get(
                        "ignore_index", args[_IGNORE_AT - 2] if len(args) > _IGNORE_AT - 2 else -100
                    )
                    check(fn, input, target, ignore)
                return original(input, target, *args, **kwargs)

            return wrapper

        return make

    def on_batch(self, batch: Any, loader: Any) -> None:
        if self.checked < self.CHECKED:
            self._batch = user_location()

    def _check(self, fn: str, pred: Any, target: Any, ignore: Any) -> None:
        if not isinstance(pred, torch.Tensor) or not isinstance(target, torch.Tensor):
            return
        if target.is_floating_point() or target.dtype == torch.bool or pred.dim() == 0:
            return  # class probabilities, not indices
        self.checked += 1
        labels = target[target != ignore] if isinstance(ignore, int) else target.flatten()
        if not labels.numel():
            return
        width = int(pred.shape[1] if pred.dim() >= 2 else pred.shape[0])
        low, high = (int(v) for v in torch.aminmax(labels))
        if (low < 0 or high >= width) and self.out_of_range is None:
            self.out_of_range = _Range(low, high, width, fn, user_location(), self._batch)
        if not torch.is_grad_enabled() or labels.numel() < MIN_LABELS:
            return
        self.labels = max(self.labels, labels.numel())
        self.one_class.append(low if low == high else -1)
        self.width = width
        if len(self.seen) < 16:
            self.seen.update(int(v) for v in torch.unique(labels)[:16])
        if self.one_class_location is None:
            self.one_class_location = self._batch or user_location()

    def findings(self, record: Any) -> Iterator[Finding]:
        if self.out_of_range is not None:
            yield _range_finding(self.out_of_range)
        first = self.one_class[:ONE_CLASS_BATCHES]
        # Sorted data shows other classes later; a multi-class head seeing one label is degenerate too. A binary
        # task whose rare class is missing from a few batches (fraud, anomalies) is neither.
        degenerate = len(self.seen) >= 2 or self.width >= 3
        if len(first) == ONE_CLASS_BATCHES and all(c >= 0 for c in first) and degenerate:
            yield _one_class_finding(first, self.labels, self.one_class_location)


def _range_finding(r: _Range) -> Finding:
    """One of the two places this module builds a finding (one per slug)."""
    if r.low >= 1 and r.high == r.width:
        fix = f"loss = F.{r.fn}(logits, y - 1)  # labels 1..{r.width} -> 0..{r.width - 1}"
    else:
        fix = (
            f"nn.Linear(hidden, {max(r.high + 1, r.width)})  # one output per class: labels go up to {r.high}\n"
            "# or remap the labels to 0..C-1 where the dataset is built"
        )
    return OUT_OF_RANGE.finding(
        f"Labels reach {r.high if r.high >= r.width else r.low} but the model outputs {r.width} classes "
        f"(0..{r.width - 1}): {r.fn} indexes the output with the label, so it fails (a CPU raises "
        "'Target out of bounds', a GPU a device-side assert) or, on some paths, reads another class.",
        evidence=[
            f"labels {r.low}..{r.high} given to {r.fn} with an input of {r.width} classes",
            f"loss computed at {fmt_loc(r.location)}; batch taken at {fmt_loc(r.batch)}",
        ],
        fix=fix,
        location=r.location,
    )


def _one_class_finding(classes: list[int], labels: int, location: Location | None) -> Finding:
    """The other place this module builds a finding."""
    return ONE_CLASS.finding(
        f"Each of the first {len(classes)} training batches holds a single class: every step pulls the model "
        "towards one class, so it swings from class to class instead of learning to separate them.",
        evidence=[
            f"classes of the first {len(classes)} batches (up to {labels} labels each): "
            + ", ".join(str(c) for c in classes),
            f"batch taken at {fmt_loc(location)}",
        ],
        fix="loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)  # mix the classes in every batch\n"
        "# without a DataLoader: perm = torch.randperm(len(X)); X, y = X[perm], y[perm] once per epoch",
        location=location,
    )

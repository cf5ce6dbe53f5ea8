"""Data sanity on the model's inputs of the first training steps: non-finite values, unnormalised features,
a batch that repeats one sample.

What the model is called with is what it learns from (a loop that scales ``x / 255`` after the loader is
judged on the scaled values), so the rule reads the positional tensor arguments of the first
:data:`BatchValues.CHECKED` root forwards with grad of a model with parameters (loss modules are root
calls too, and are skipped). Reading values synchronises with the device, which is why only a few
batches are read and the rule stays on by default.

- ``input-not-finite``: NaN in any floating input, or an infinity in the first one (a second argument may
  be an additive attention mask, where ``-inf`` is meant);
- ``input-unnormalised``: the first input's features (the columns of a 2-D batch) on root-mean-square scales
  :data:`SCALE_RATIO` or more apart, or values :data:`RAW_MAX` and beyond at a root mean square of
  :data:`RAW_RMS` or more (raw pixels 0-255, raw sensor counts);
- ``batch-constant``: every row of the first input identical, in :data:`CONSTANT_BATCHES` or more of the
  batches read (a dataset that returns one sample whatever the index, a ``torch.ones`` placeholder).

The finding names the line the batch came from (the loop over the DataLoader) when one did, else the
line that called the model.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from torchscalpel.doctor.rule import RuleInfo
from torchscalpel.doctor.rules._common import fmt_loc
from torchscalpel.doctor.runtime_rules import RuntimeRule, iter_tensors, user_location
from torchscalpel.findings import Finding, Location, Severity

SCALE_RATIO = 1e3
"""Features whose root-mean-square scales differ by this factor are unnormalised."""
RAW_MAX = 100.0
RAW_RMS = 20.0
"""Inputs reaching ``RAW_MAX`` with a root mean square of ``RAW_RMS`` were not scaled (raw 0-255 pixels)."""
CONSTANT_BATCHES = 2
MIN_ROWS = 4
"""Rows a batch needs before its rows being identical says anything."""

NOT_FINITE = RuleInfo(
    slug="input-not-finite",
    severity=Severity.ERROR,
    category="data",
    summary="NaN or infinite values in the model's inputs",
    kinds=("runtime",),
)
UNNORMALISED = RuleInfo(
    slug="input-unnormalised",
    severity=Severity.WARNING,
    category="data",
    summary="input features on scales orders of magnitude apart, or not scaled at all",
    kinds=("runtime",),
)
CONSTANT = RuleInfo(
    slug="batch-constant",
    severity=Severity.WARNING,
    category="data",
    summary="every sample of a batch identical",
    kinds=("runtime",),
)


@dataclass(slots=True)
class _Seen:
    """What one problem looked like where it was first seen."""

    detail: str
    batch: int
    location: Location | None
    forward: Location | None
    count: int = 1


@dataclass(slots=True)
class _Batch:
    """Where the latest DataLoader batch was taken (the loop's line), and whether a forward consumed it."""

    location: Location | None = None
    fresh: bool = False
    seen: dict[str, _Seen] = field(default_factory=dict)


class BatchValues(RuntimeRule):
    """The three checks of the module docstring on the first training forwards' inputs."""

    infos = (NOT_FINITE, UNNORMALISED, CONSTANT)
    CHECKED = 4
    """Training forwards whose inputs are read."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = 0
        self.state = _Batch()
        self._has_params: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()

    def on_batch(self, batch: Any, loader: Any) -> None:
        if self.checked < self.CHECKED and torch.is_grad_enabled():
            self.state.location, self.state.fresh = user_location(), True

    def on_forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any, root: bool) -> None:
        if not root or self.checked >= self.CHECKED or not torch.is_grad_enabled():
            return
        has = self._has_params.get(module)
        if has is None:
            has = self._has_params[module] = next(module.parameters(), None) is not None
        if not has:
            return
        tensors = [t for t in iter_tensors(args, limit=4) if t.numel()]
        if not tensors:
            return
        self.checked += 1
        batch_loc = self.state.location if self.state.fresh else None
        self.state.fresh = False
        forward = user_location()
        for slug, detail in _problems(tensors):
            seen = self.state.seen.get(slug)
            if seen is None:
                self.state.seen[slug] = _Seen(detail, self.checked, batch_loc or forward, forward)
            else:
                seen.count += 1

    def findings(self, record: Any) -> Iterator[Finding]:
        for slug, seen in self.state.seen.items():
            if slug == CONSTANT.slug and seen.count < CONSTANT_BATCHES:
                continue
            yield _finding(slug, seen, self.checked)


def _problems(tensors: list[torch.Tensor]) -> Iterator[tuple[str, str]]:
    """(slug, what was seen) for each problem of one forward's positional tensors."""
    first = tensors[0]
    for i, t in enumerate(tensors):
        if not t.is_floating_point():
            continue
        nan = int(torch.isnan(t).sum())
        inf = int(torch.isinf(t).sum()) if i == 0 else 0
        if nan or inf:
            parts = [f"{nan} NaN" if nan else "", f"{inf} infinite" if inf else ""]
            yield (
                NOT_FINITE.slug,
                f"{' and '.join(p for p in parts if p)} value(s) of {t.numel()} in input {i} "
                f"(shape {tuple(t.shape)})",
            )
    if first.is_floating_point() and first.dim() >= 2 and first.shape[0] >= MIN_ROWS:
        values = torch.nan_to_num(first.detach().double(), nan=0.0, posinf=0.0, neginf=0.0)
        rms = float(values.square().mean().sqrt())
        peak = float(values.abs().max())
        spread = _column_spread(values)
        if spread is not None:
            yield UNNORMALISED.slug, spread
        elif peak >= RAW_MAX and rms >= RAW_RMS:
            yield (
                UNNORMALISED.slug,
                f"values up to {peak:.4g} (root mean square {rms:.4g}) in input 0, shape {tuple(first.shape)}",
            )
    rows = (
        first.dtype != torch.bool and first.dim() >= 1 and first.shape[0] >= MIN_ROWS and first[0].numel() > 1
    )
    if rows and bool((first == first[:1]).all()):
        yield (
            CONSTANT.slug,
            f"all {first.shape[0]} rows of input 0 (shape {tuple(first.shape)}) are the same",
        )


def _column_spread(values: torch.Tensor) -> str | None:
    """The features' scales when a 2-D batch's columns are :data:`SCALE_RATIO` apart, else None."""
    if values.dim() != 2 or values.shape[1] < 2:
        return None
    col = values.square().mean(dim=0).sqrt()
    used = (col > 0).nonzero().flatten()
    if used.numel() < 2:
        return None
    scales = col[used]
    hi, lo = int(used[scales.argmax()]), int(used[scales.argmin()])
    if float(col[hi]) < SCALE_RATIO * float(col[lo]):
        return None
    return (
        f"feature {hi} has a root mean square of {float(col[hi]):.4g}, feature {lo} of {float(col[lo]):.4g} "
        f"({float(col[hi]) / float(col[lo]):.0f}x apart) in input 0, shape {tuple(values.shape)}"
    )


_FIXES = {
    NOT_FINITE.slug: "# drop (or impute) the rows with missing values before the data reaches the model:\n"
    "keep = torch.isfinite(X).all(dim=1)\n"
    "X, y = X[keep], y[keep]          # or X = torch.nan_to_num(X, nan=0.0) with a mask feature",
    UNNORMALISED.slug: "# standardise with statistics of the training split, the same for every split:\n"
    "mean, std = X_train.mean(dim=0), X_train.std(dim=0).clamp_min(1e-8)\n"
    "X_train, X_val = (X_train - mean) / std, (X_val - mean) / std\n"
    "# images: x = x / 255.0, or transforms.Normalize(mean, std) in the dataset's transform",
    CONSTANT.slug: "# every sample of the batch is the same: the dataset must use its index\n"
    "def __getitem__(self, i):\n"
    "    return self.x[i], self.y[i]    # not self.x[0] or a fixed placeholder tensor",
}
_MESSAGES = {
    NOT_FINITE.slug: "The model's inputs hold NaN or infinite values: every loss and gradient that touches them "
    "becomes NaN, and the weights follow after the first optimizer step.",
    UNNORMALISED.slug: "The model's inputs are not normalised: features on scales orders of magnitude apart (or raw, "
    "unscaled values) make the large ones dominate the first layer and the gradients, so training is slow or "
    "unstable at any one learning rate.",
    CONSTANT.slug: "Every sample of the training batches is identical: the model sees one example repeated and "
    "learns nothing about the others.",
}


_INFOS = {info.slug: info for info in (NOT_FINITE, UNNORMALISED, CONSTANT)}


def _finding(slug: str, seen: _Seen, checked: int) -> Finding:
    """The one place this module builds its findings."""
    return _INFOS[slug].finding(
        _MESSAGES[slug],
        evidence=[
            f"{seen.detail}, first in training batch {seen.batch} ({seen.count} of the {checked} batches read)",
            f"batch taken at {fmt_loc(seen.location)}; model called at {fmt_loc(seen.forward)}",
        ],
        fix=_FIXES[slug],
        location=seen.location,
    )

"""What the fake-tensor simulation needs around it: torch's fake-tensor log lines held back (the error says it once),
and the one data read in torch's own modules that fake tensors cannot answer turned into its shape-only answer."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator

import torch

from torchscalpel.runtime.patching import wrap_attr

FAKE_LOGGERS = ("torch._subclasses.fake_tensor",)
"""torch loggers that print a traceback for an op that fails on meta / fake tensors; planning turns such a
failure into one sentence, so their lines are held back unless ``SCALPEL_DEBUG`` is set."""


@contextlib.contextmanager
def causal_masks_undetected() -> Iterator[None]:
    """nn.Transformer and nn.TransformerEncoder given a mask but no ``is_causal`` hint compare the mask's values
    with a causal one (``_detect_is_causal_mask``), a data read fake tensors cannot answer: Lightning's demo
    Transformer does so with every step. Under the simulation the check answers "not causal", the path that
    uses the mask as given: the same tensors are allocated either way in a training step, and ``is_causal``
    only picks an attention kernel."""
    from torch.nn.modules import transformer

    def make(original: Callable[..., bool]) -> Callable[..., bool]:
        def detect(mask: torch.Tensor | None, is_causal: bool | None = None, size: int | None = None) -> bool:
            if (
                is_causal is None
                and mask is not None
                and isinstance(mask, torch._subclasses.fake_tensor.FakeTensor)
            ):
                return False
            return original(mask, is_causal, size)

        return detect

    try:
        undo = wrap_attr(transformer, "_detect_is_causal_mask", make)
    except AttributeError:  # a torch without the check
        yield
        return
    try:
        yield
    finally:
        undo()


@contextlib.contextmanager
def quiet_fake_logs() -> Iterator[None]:
    """Hold back torch's own log lines for ops failing on fake tensors (the error says it once, clearly)."""
    if os.environ.get("SCALPEL_DEBUG"):
        yield
        return
    loggers = [logging.getLogger(name) for name in FAKE_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)

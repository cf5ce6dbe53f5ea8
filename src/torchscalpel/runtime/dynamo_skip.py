"""Keep dynamo out of the allocation tracker's hot callbacks: marked once on their code objects (checked in C
at frame evaluation) instead of a Python wrapper per call; and keep dynamo away from the user's compiled frames
while a measuring dispatch mode is active (:func:`force_eager`)."""

from __future__ import annotations

from typing import Any


def _exec_strategy() -> Any:
    """torch's C-level "skip this code and all it calls" marker for dynamo, or None on a torch without one."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:
        return None
    return lambda code: set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))


_MARK_SKIP = _exec_strategy()
CODE_SKIP_AVAILABLE = _MARK_SKIP is not None
"""This torch has the C-level marker (else the tracker keeps its own ``_should_skip_dynamo`` wrapper)."""


def skip_dynamo_recursively(*functions: Any) -> None:
    """Tell dynamo never to trace these functions nor anything they call (what ``disable(recursive=True)`` does).

    Marked once on the code objects, checked in C at frame evaluation, instead of a Python wrapper per call.
    """
    if _MARK_SKIP is not None:
        for fn in functions:
            _MARK_SKIP(fn.__code__)


def force_eager() -> Any:
    """Set dynamo's ``force_eager`` stance now; returns the context whose ``__exit__`` restores the previous one.

    For the span of a non-infra dispatch mode (the FLOP counter, the allocation tracker). Without it dynamo
    meets a ``torch.compile``'d frame under the mode, refuses to run its compiled code ("non-infra torch
    dispatch mode present") and marks the frame's code object "skip" for the rest of the process: every later
    call of the model runs eagerly, long after the mode is gone (torch 2.13: a 12-step aot_eager script ran its
    compiled graph 2 times under ``scalpel profile``, 12 times under plain python). Under the stance dynamo
    intercepts no frame, so nothing is marked and the compiled code runs again once the stance is restored.
    None on a torch without ``torch.compiler.set_stance``, or when called inside a compiled region.
    """
    import torch

    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None or torch.compiler.is_compiling():
        return None
    return set_stance("force_eager")  # the stance is set on construction; __exit__ restores the previous one

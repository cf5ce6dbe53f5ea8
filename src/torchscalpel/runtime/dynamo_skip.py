"""Keep dynamo out of the allocation tracker's hot callbacks: marked once on their code objects (checked in C
at frame evaluation) instead of a Python wrapper per call."""

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

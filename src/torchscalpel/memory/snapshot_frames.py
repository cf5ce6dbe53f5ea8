"""What a frame of a memory snapshot says: whether it is the user's, and which phase of the step (parameters,
gradients, optimizer state, activations) the torch function in it marks. The pure-Python reader
(:mod:`torchscalpel.memory.snapshot`) reads a block's frames with :func:`traceback_facts`; the C reader
calls :func:`frame_code` for each distinct frame and finds the same site and phase.
"""

from __future__ import annotations

import functools
from typing import Any

from torchscalpel.runtime.userframes import Kind, file_kind

PHASES = ("other", "parameters", "gradients", "optimizer_state", "activations")
"""What a block was allocated for, read from its traceback (the innermost frame that marks one), in the
order of the C reader's PH_* codes. "other": no torch frame says (the user's own tensors, data, caches)."""
_FORWARD = frozenset({"_call_impl", "_wrapped_call_impl"})
_PARAMETER_SETUP = frozenset(
    {
        "_apply",
        "to",
        "cuda",
        "load_state_dict",
        "_load_from_state_dict",
        "register_parameter",
        "register_buffer",
    }
)


@functools.lru_cache(maxsize=65536)
def frame_code(file: str, function: str) -> int:
    """What a frame of a snapshot is: bit 0 when the file is the user's (:mod:`runtime.userframes`),
    bits 1-3 the index in :data:`PHASES` its torch function marks (0: none).

    The marks are torch's own entry points, by file and function: a module's ``forward`` call
    (``nn/modules/module.py`` ``_call_impl``), autograd's backward (``autograd/graph.py``
    ``_engine_run_backward``, ``autograd/__init__.py`` ``backward``/``grad``, ``Tensor.backward``), an
    optimizer's code (``torch/optim/``: ``step``, ``_init_group`` creating the state), and a module being
    built, moved or loaded (``__init__`` under ``nn/modules/``, ``Module._apply``/``to``/``load_state_dict``,
    ``nn/parameter.py``). ``autograd/function.py`` is not one: a custom Function's ``apply`` runs in forward.
    A native frame (C++, recorded with ``stacks="all"``) marks backward when it is the autograd engine's or
    a generated ``...Backward`` node's: the only frames a CUDA backward allocation has. Bit 0 counts for
    ``.py`` files only.
    """
    kind = file_kind(file)
    phase = 0
    if not file.endswith(".py"):  # a native frame: on CUDA, backward runs in the autograd engine's thread,
        # whose allocations have no Python frame at all, only these
        if "autograd::Engine::" in function or (
            "autograd::generated::" in function and "Backward" in function
        ):
            phase = 2
    elif kind is Kind.TORCH:
        p = file.replace("\\", "/")
        if "/optim/" in p:
            phase = 3
        elif (
            (p.endswith("/autograd/graph.py") and function == "_engine_run_backward")
            or (p.endswith("/autograd/__init__.py") and function in ("backward", "grad"))
            or (p.endswith("/_tensor.py") and function == "backward")
        ):
            phase = 2
        elif p.endswith("/nn/modules/module.py"):
            phase = 4 if function in _FORWARD else 1 if function in _PARAMETER_SETUP else 0
        elif ("/nn/modules/" in p and function == "__init__") or p.endswith("/nn/parameter.py"):
            phase = 1
    return int(kind is Kind.USER) | phase << 1


INT64_LIMIT = 1 << 63
"""A number in a snapshot is an int with ``abs(v) < INT64_LIMIT`` (the C reader's int64, less its lowest value,
so that the range is symmetric), else it is not one torch wrote: not shown, and not counted."""


def line_text(line: Any) -> str:
    """A frame's line as the C reader writes it: None, a bool, an int64, a float (``repr``) or a string as they
    are; anything else (a 5000-digit int, bytes, a list) ``?``."""
    if line is None or type(line) in (bool, str):
        return str(line)
    if (
        type(line) is float
    ):  # the C reader's rule: the fewest %g digits that read back, ".0" when it looks whole
        if line != line:
            return "nan"
        for digits in range(1, 18):
            text = f"{line:.{digits}g}"
            if digits == 17 or float(text) == line:
                return text if any(ch in text for ch in ".eni") else text + ".0"
    if type(line) is int and -INT64_LIMIT < line < INT64_LIMIT:
        return str(line)
    return "?"


def traceback_facts(frames: Any) -> tuple[str, int]:
    """A block's call site and phase from its frames (innermost first), as the C reader finds them.

    The site: the innermost ``.py`` frame of the user's code, else the innermost ``.py`` frame, as
    ``file:line``. The phase: the index in :data:`PHASES` of the innermost frame that marks one.
    """
    if not isinstance(frames, list):
        return "(no frames)", 0
    site = fallback = None
    phase = 0
    for f in frames:
        if not isinstance(f, dict):
            continue
        fn = f.get("filename", "")
        if not isinstance(fn, str):
            continue
        name = f.get("name")
        code = frame_code(fn, name if isinstance(name, str) else "")
        if phase == 0:
            phase = code >> 1
        if not fn.endswith(".py"):
            continue
        if code & 1 and site is None:
            site = f"{fn}:{line_text(f.get('line'))}"
        if fallback is None:
            fallback = f"{fn}:{line_text(f.get('line'))}"
        if site is not None and phase:
            break
    return site or fallback or "(no Python frame)", phase

"""Compile triage inside a trial: graph breaks with file:line, recompiles with their guard, and a
compile failure attributed to one function, excluded with ``torch.compiler.disable`` and retried.

- **Breaks and recompiles** come from dynamo's own records: the reason of every graph break with
  its user stack (what ``torch._dynamo.explain`` reports), and every failed guard keyed by the code
  it recompiled; both give the user file and line.
- **A failing compile**: the backend is wrapped, so when it raises, the graph it was given is still
  at hand. The failing op is the node named in the error (inductor names the target, e.g.
  ``aten.sin.default``); its ``stack_trace`` gives the innermost user function. That function is
  wrapped in ``torch.compiler.disable`` where the script looks it up (its class, or the module
  globals that hold it) and the call is retried once; a second failure is the trial's failure.
"""

from __future__ import annotations

import re
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from torchscalpel.runtime.userframes import is_user_file

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')


@dataclass(slots=True)
class TriageLog:
    """What dynamo reported in this process (the trial section's ``compile`` entry)."""

    breaks: list[dict[str, str]] = field(default_factory=list)
    """``where`` (file:line) and ``reason`` of each distinct graph break."""
    recompiles: list[dict[str, str]] = field(default_factory=list)
    """``where`` and ``guard`` (the first failed guard) of each recompile."""
    fullgraph: dict[str, Any] = field(default_factory=dict)
    """``attempted``, ``ok`` and, when it failed, ``reason`` / ``where``."""
    excluded: list[dict[str, str]] = field(default_factory=list)
    """Functions excluded after a compile failure: ``function``, ``where``, ``cause``, ``retried``."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "breaks": self.breaks[:20],
            "recompile_guards": self.recompiles[:20],
            "fullgraph": dict(self.fullgraph),
            "excluded": list(self.excluded),
        }


TRIAGE = TriageLog()
"""The process's triage log (a trial process compiles for one settings object)."""


def collect_dynamo(log: TriageLog) -> TriageLog:
    """Fill ``log`` from dynamo's own records: every graph break's reason with its user stack
    (``torch._dynamo.utils.graph_break_reasons``), and every recompile's failed guard keyed by the
    code object it recompiled (``guard_failures``), so both carry a file:line."""
    from torch._dynamo import utils

    for reason in list(getattr(utils, "graph_break_reasons", []) or []):
        frames = [f for f in getattr(reason, "user_stack", []) or [] if is_user_file(f.filename)]
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        first = str(getattr(reason, "reason", "")).strip().splitlines()
        entry = {"where": where, "reason": (first[0] if first else "unknown")[:300]}
        if entry not in log.breaks:
            log.breaks.append(entry)
    for code, reasons in dict(getattr(utils, "guard_failures", {}) or {}).items():
        where = f"{getattr(code, 'co_filename', '?')}:{getattr(code, 'co_firstlineno', '?')}"
        for text in reasons:
            entry = {
                "where": where,
                "guard": str(text).strip().splitlines()[0][:300] if str(text).strip() else "",
            }
            if entry not in log.recompiles:
                log.recompiles.append(entry)
    return log


def reset_dynamo_records() -> None:
    """Forget dynamo's recorded graph-break reasons (with the counters, for a clean trial or test)."""
    from torch._dynamo import utils

    reasons = getattr(utils, "graph_break_reasons", None)
    if reasons is not None:
        reasons.clear()


# -- failure attribution ----------------------------------------------------------------------------


def user_frames(stack_trace: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the frames in a node's stack trace that are user code."""
    return [(f, int(n), fn) for f, n, fn in _FRAME.findall(stack_trace or "") if is_user_file(f)]


def failing_frame(gm: torch.fx.GraphModule, error: BaseException) -> tuple[str, int, str] | None:
    """The innermost user frame of the graph node the error names (None when none is named)."""
    text = "".join(traceback.format_exception_only(type(error), error))
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    for node in nodes:
        names = {node.name, str(node.target), getattr(node.target, "__name__", "")}
        names |= {str(node.target).split(".")[-1]} if node.op == "call_function" else set()
        if any(len(n) > 2 and re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", text) for n in names if n):
            frames = user_frames(node.meta.get("stack_trace", ""))
            if frames:
                return frames[-1]
    return None


class FailureRecorder:
    """A backend wrapper that remembers the user frame of the op a failing compile names.

    It wraps the backend *as torch.compile configures it* (inductor with its mode's config
    patches: ``reduce-overhead`` is inductor with CUDA graphs on), so passing it as ``backend=``
    with no mode compiles exactly what ``torch.compile(mode=..., backend=...)`` would.
    """

    def __init__(self, backend: str, mode: str | None, dynamic: bool | None) -> None:
        self.name = backend
        self.mode = None if mode == "default" else mode
        self.dynamic = dynamic
        self._backend: Any = None
        self.frame: tuple[str, int, str] | None = None

    @property
    def backend(self) -> Any:
        """The configured backend, built on first use: a backend the script registers itself
        exists only once the script has run that far (the knob is installed before it starts)."""
        if self._backend is None:
            if self.name == "inductor":
                self._backend = torch._TorchCompileInductorWrapper(self.mode, None, self.dynamic)
            else:
                self._backend = torch._TorchCompileWrapper(self.name, self.mode, None, self.dynamic)
        return self._backend

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        try:
            return self.backend(gm, example_inputs)
        except Exception as exc:
            self.frame = failing_frame(gm, exc) or self.frame
            raise

    def get_compiler_config(self) -> Any:
        """Dynamo asks the backend for its config (inductor's mode patches)."""
        getter = getattr(self.backend, "get_compiler_config", None)
        return getter() if getter is not None else None

    def reset(self) -> None:
        """``torch._dynamo.reset`` resets the backend's caches."""
        reset = getattr(self._backend, "reset", None)
        if reset is not None:
            reset()


def disable_function(frame: tuple[str, int, str], roots: list[torch.nn.Module]) -> str | None:
    """Wrap the function defined at ``frame`` in ``torch.compiler.disable`` where it is looked up:
    a method of a module class in ``roots``, or a global of a loaded module (``__main__`` first).
    Returns its qualified name, or None when no such function is reachable."""
    path, line, name = frame

    def matches(fn: Any) -> bool:
        code = getattr(fn, "__code__", None)
        return (
            code is not None
            and code.co_name == name
            and code.co_filename == path
            and code.co_firstlineno <= line
        )

    for cls in {type(m) for root in roots for m in root.modules()}:
        for attr, value in list(vars(cls).items()):
            if callable(value) and matches(value):
                setattr(cls, attr, torch.compiler.disable(value))
                return f"{cls.__name__}.{attr}"
    modules = [sys.modules.get("__main__"), *[m for k, m in list(sys.modules.items()) if k != "__main__"]]
    for module in modules:
        if module is None or getattr(module, "__file__", None) != path:
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) and matches(value):
                setattr(module, attr, torch.compiler.disable(value))
                return attr
    return None


def is_compile_error(exc: BaseException) -> bool:
    """True for errors raised by dynamo / a backend while compiling (not by the user's own code)."""
    from torch._dynamo import exc as dynamo_exc

    kinds = tuple(
        k
        for k in (
            getattr(dynamo_exc, "BackendCompilerFailed", None),
            getattr(dynamo_exc, "InternalTorchDynamoError", None),
        )
        if k is not None
    )
    return isinstance(exc, kinds) or type(exc).__module__.startswith(("torch._inductor", "torch._dynamo"))


def guard_advice(guard: str) -> str:
    """What to change for a recompile whose failed guard is ``guard`` ("" when no cause is known):
    a transformers cache built in training, or input shapes that change (a last smaller batch)."""
    text = guard.lower()
    if "cache_utils" in text or "dynamiccache" in text or "past_key_values" in text:
        return (
            "the model builds a key/value cache in training (transformers' use_cache): "
            "set model.config.use_cache = False"
        )
    if "size mismatch" in text or ("sizes" in text and "mismatch" in text) or "shape" in text:
        return (
            "input shapes changed between steps (a last smaller batch?): compile with dynamic=True, "
            "or give the DataLoader drop_last=True"
        )
    return ""

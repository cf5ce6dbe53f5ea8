"""The op-line pass: after the cheap profiler window, one short window that names each op's user line.

The profiler window records no stacks (a stack per op costs more than many ops). Once it has closed,
this pass profiles one or two more steps with shapes, and tags every torch call with the user's
``file:line`` (``runtime.userframes``: the innermost frame that is the user's), so each op of the top
ops table gets the line that called it, and the pattern rules (:mod:`torchscalpel.trace.patterns`)
can name the line to change.

Why not torch.profiler's own ``with_stack=True``: in torch 2.13 its Python frames are named by the
function's first line (``model.py(35): forward``, the ``def``), not the line executing (measured: an
``aten::mm`` called at line 6 of ``f`` is listed as ``f``'s line 5), and ``FunctionEvent.stack`` is
empty unless ``experimental_config=_ExperimentalConfig(verbose=True)``, which gives the same ``def``
lines. A torch function mode sees the caller's live frame, whose ``f_lineno`` is the line running;
it wraps each call in a profiler range named ``scalpel.site:FILE:LINE`` that the ops nest in.
``--with-stack`` still records torch's stacks in the main window, for users who want the full trace.

When the call is made by an installed package (transformers' ``eager_attention_forward``), the user's
line is the one that called into the package (``outputs = model(**batch)``), which says nothing about
which op pattern it is; the range then also carries the package's own line, the innermost frame
outside torch (``scalpel.site:USER:LINE<US>LIB:LINE``, US the ASCII unit separator), so the rules see
the library's code and a finding names both lines.

Under ``torch.compile`` the pass names no line: a torch function mode entered after compilation fails
dynamo's guards, so the compiled code would be recompiled with the mode or run eagerly (measured on a
compiled attention model: the pass took 11.9 s and timed the eager ops, calling them "unfused attention"
and "tiny ops, use torch.compile"). When the script has compiled graphs, the pass profiles the step
without the mode, measures the share of it inside compiled regions, and says "not measured: compiled
region"; ops inside a compiled region are the compiler's and have no user line.

The pass's steps are marked ``profiled`` and ``op_lines`` (left out of timings, like the window's);
its cost (the steps' wall time plus reading the events back) is recorded in ``profiler.op_lines``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

from torchscalpel.findings import Finding
from torchscalpel.record import StepRecord
from torchscalpel.runtime.native_log import native_stderr_to
from torchscalpel.runtime.userframes import Kind, Site, call_site
from torchscalpel.trace.op_events import OpEvent, PassFacts, op_lines
from torchscalpel.trace.patterns import find_patterns

SITE_PREFIX = "scalpel.site:"
LIBRARY_SEP = "\x1f"
"""Between the user's site and the library's in a range name (no file name holds it)."""
OURS = "torchscalpel"
"""The site of a call torchscalpel's own code made (the loss it records, a wrapper's ``.item()``)."""


COMPILED_RANGES = ("Torch-Compiled Region", "CompiledFunctionBackward")
"""Profiler ranges around torch.compile'd code: dynamo's forward region and AOTAutograd's backward."""


def dynamo_graphs() -> int:
    """Graphs ``torch.compile`` has built in this process (0 when dynamo was never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    try:
        return int(utils.counters["stats"]["unique_graphs"])
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0


def compiled_us(prof: profile) -> float:
    """Host time of the pass inside compiled regions (outermost ranges only: a region is counted once)."""
    total = 0.0
    for evt in prof.events():
        if not evt.name.startswith(COMPILED_RANGES):
            continue
        p = evt.cpu_parent
        while p is not None and not p.name.startswith(COMPILED_RANGES):
            p = p.cpu_parent
        if p is None:
            total += float(evt.cpu_time_total)
    return total


def range_name(site: Site) -> str | None:
    """The profiler range a torch call is wrapped in, from where the call came from
    (:func:`~torchscalpel.runtime.userframes.call_site`).

    ``scalpel.site:FILE:LINE``, the user's line; when an installed package made the call (transformers'
    ``torch.matmul(query, key.transpose(-1, -2))``) the package's line follows after :data:`LIBRARY_SEP`.
    ``scalpel.site:`` + :data:`OURS` when the call is torchscalpel's own code; a wrapper installed with
    ``runtime.patching.wrap_attr`` passes the user's call through (``loss.backward()`` goes through the
    runtime's wrapper and is the user's line). None when no frame is the user's: the call is not wrapped.
    """
    if site.caller is Kind.SCALPEL:
        return SITE_PREFIX + OURS
    if site.file is None:
        return None
    if site.caller is Kind.THIRD_PARTY:
        return f"{SITE_PREFIX}{site.user}{LIBRARY_SEP}{site.library}"
    return f"{SITE_PREFIX}{site.user}"


class SiteMode(TorchFunctionMode):
    """Wraps every torch call the user's code makes in a profiler range named after its line."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
        self._range: Any = fast if fast is not None else torch.profiler.record_function

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = range_name(call_site(sys._getframe(1)))
        if name is None:
            return func(*args, **kwargs)
        self.calls += 1
        with self._range(name):
            return func(*args, **kwargs)


RangeSite = tuple[str | None, str | None]
"""(the user's ``file:line``, the library's ``file:line`` or None), read back from a range's name."""


def _site_of(evt: Any) -> tuple[RangeSite, str | None, bool, Any]:
    """(site, the op it runs inside, ours, its backward function event or None) from an event's parents."""
    parent_op, bw = None, None
    p = evt.cpu_parent
    while p is not None:
        name = p.name
        if name.startswith(SITE_PREFIX):
            if name == SITE_PREFIX + OURS:
                return (None, None), parent_op, True, bw
            user, _, library = name[len(SITE_PREFIX) :].partition(LIBRARY_SEP)
            return (user, library or None), parent_op, False, bw
        if bw is None and getattr(p, "scope", 0) == 1:  # BACKWARD_FUNCTION: autograd's node for a forward op
            bw = p
        if parent_op is None and (name.startswith("aten::") or name.startswith("cuda")):
            parent_op = name
        p = p.cpu_parent
    return (None, None), parent_op, False, bw


def events_from(prof: profile) -> list[OpEvent]:
    """The pass's ops as :class:`OpEvent` (torchscalpel's own calls and the step ranges left out).

    A backward op is named by the forward op's line (what torch's own ``_set_backward_stacktraces``
    does for stacks: the backward function's ``sequence_nr`` and forward thread find the forward op),
    so ``aten::bmm`` in backward is charged to the ``q @ k.transpose`` line, not to ``loss.backward()``.
    """
    kept = []
    forward_sites: dict[tuple[int, int], RangeSite] = {}
    for evt in prof.events():
        name = evt.name
        if not (name.startswith("aten::") or name.startswith("cuda")) or name.startswith("cudaLaunch"):
            continue
        if getattr(evt, "device_type", None) is not None and str(evt.device_type) != "DeviceType.CPU":
            continue
        site, parent, ours, bw = _site_of(evt)
        if ours:
            continue
        seq = getattr(evt, "sequence_nr", -1)
        if bw is None and site[0] is not None and seq is not None and seq >= 0:
            forward_sites.setdefault((seq, evt.thread), site)
        kept.append((evt, site, parent, bw))
    out = []
    for evt, site, parent, bw in kept:
        if bw is not None:
            site = forward_sites.get((bw.sequence_nr, bw.fwd_thread), site)
        kernels = tuple(str(getattr(k, "name", k)) for k in getattr(evt, "kernels", ()) or ())
        shapes = tuple(
            tuple(int(d) for d in s) for s in (evt.input_shapes or []) if isinstance(s, list | tuple)
        )
        out.append(
            OpEvent(
                name=evt.name,
                site=site[0],
                library_site=site[1],
                start_us=float(evt.time_range.start),
                self_us=float(evt.self_cpu_time_total),
                total_us=float(evt.cpu_time_total),
                device_us=float(getattr(evt, "self_device_time_total", 0.0) or 0.0),
                shapes=shapes,
                parent=parent,
                kernels=kernels,
                backward=bw is not None,
            )
        )
    return out


def free_profiler(prof: profile) -> None:
    """Free the pass's results now, while the process runs.

    Left to the garbage collector, the profiler's results sit in a reference cycle until the
    interpreter exits, and freeing them there crashed it (torch 2.13, a script that ran CPU flash
    attention: a segfault in ``~vector<Result>`` during ``Py_FinalizeEx``, after run.json was written).
    The heap was corrupted earlier, by a range that crossed from the window's session into this pass's
    (see ``ProfilerWindow._plan_pass``, which now keeps them apart); freeing early stays, as it returns
    the memory while the script runs.
    """
    inner = getattr(prof, "profiler", None)
    if inner is not None:
        for name in ("kineto_results", "function_events", "_function_events"):
            if hasattr(inner, name):
                try:
                    setattr(inner, name, None)
                except (AttributeError, TypeError):
                    pass
    prof.profiler = None


class OpLinePass:
    """One or two steps profiled with shapes and user lines, right after the profiler window."""

    def __init__(self, steps: int, first: int, log_path: Path | None) -> None:
        self.asked = steps
        self.first = first
        self.log_path = log_path
        self.steps: list[int] = []
        self.step_ms = 0.0
        self._prof: profile | None = None
        self._mode: SiteMode | None = None
        self._t0 = 0.0
        self.seconds: float | None = None
        self.error: str | None = None
        self.ops: list[dict[str, Any]] = []
        self.findings: list[Finding] = []
        self.events = 0
        self.graphs = 0
        """Graphs torch.compile had built when the pass started (the mode is left out when any)."""
        self.compiled_share: float | None = None
        """Share of the pass's step inside compiled regions (None: no compiled region ran)."""

    @property
    def running(self) -> bool:
        return self._prof is not None

    def start(self) -> None:
        """Open the pass at the start of step ``first``."""
        self._t0 = time.perf_counter()
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        try:
            self._prof = profile(activities=activities, record_shapes=True, with_stack=False)
            with native_stderr_to(self.log_path):
                self._prof.start()
            self.graphs = dynamo_graphs()
            if not self.graphs:  # compiled code would be recompiled under the mode: leave it as it runs
                self._mode = SiteMode()
                self._mode.__enter__()
        except Exception as exc:  # a pass that cannot start must not stop the user's run
            self._prof, self.error = None, f"the op-line pass failed to start: {exc!r}"

    def on_step_closed(self, step: StepRecord) -> bool:
        """Mark a step of the pass; True when the pass is over."""
        step.profiled = True
        step.op_lines = True
        self.steps.append(step.index)
        self.step_ms += step.total_ms
        if len(self.steps) >= self.asked:
            self.close(complete=True)
            return True
        return False

    def close(self, *, complete: bool = False) -> None:
        """Stop the pass and read its events (a pass the script ended in the middle of is dropped)."""
        prof, self._prof = self._prof, None
        if prof is None:
            return
        if self._mode is not None:
            mode, self._mode = self._mode, None
            try:
                mode.__exit__(None, None, None)
            except Exception as exc:
                self.error = f"the op-line pass's torch function mode could not be removed: {exc!r}"
        try:
            with native_stderr_to(self.log_path):
                prof.stop()
            if not complete or not self.steps:
                self.error = self.error or "the script ended inside the op-line pass"
                return
            inside = compiled_us(prof)
            if inside > 0 or self.graphs:
                self._not_measured_compiled(inside)
                return
            events = events_from(prof)
            self.events = len(events)
            facts = PassFacts(
                step_us=self.step_ms * 1000.0,
                steps=len(self.steps),
                cuda=torch.cuda.is_available(),
                compute_capability=torch.cuda.get_device_capability() if torch.cuda.is_available() else None,
            )
            self.ops = op_lines(events)
            self.findings = find_patterns(events, facts)
        except Exception as exc:
            self.error = f"the op-line pass could not be read: {exc!r}"
        finally:
            free_profiler(prof)
            self.seconds = time.perf_counter() - self._t0

    def _not_measured_compiled(self, inside_us: float) -> None:
        """The script runs torch.compile'd code: no op gets a line, and the error says how much was compiled."""
        step_us = self.step_ms * 1000.0
        self.compiled_share = min(inside_us / step_us, 1.0) if step_us > 0 else None
        graphs = max(self.graphs, dynamo_graphs())
        if self.compiled_share is None:
            share = "the pass's step time was not measured"
        elif inside_us > 0:
            share = f"{100 * self.compiled_share:.0f}% of the pass's step ran inside compiled regions"
        else:
            share = "none of the pass's step ran inside a compiled region"
        self.error = (
            f"compiled region: the script built {graphs} torch.compile graph(s) ({share}); compiled ops are the "
            "compiler's kernels and have no line, and a torch function mode would make dynamo recompile, so the "
            "pass profiled the step as it runs and named no line"
        )

    def result(self) -> dict[str, Any]:
        """The record's ``profiler.op_lines``."""
        out: dict[str, Any] = {"steps": self.steps, "seconds": self.seconds, "step_ms": self.step_ms}
        if self.compiled_share is not None:
            out["compiled_share"] = self.compiled_share
        if self.error:
            out["error"] = self.error
        out["ops"] = self.ops
        return out

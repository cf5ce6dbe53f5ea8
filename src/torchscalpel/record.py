"""The Run record: the single hand-off between stages (profile -> doctor, tune, plan, report).

A record is one JSON file, ``run.json``, with a ``schema_version`` of the form ``MAJOR.MINOR``.
Readers accept any record whose major version is not newer than theirs; unknown keys written
by a newer minor version are kept (in ``extra``) rather than dropped, so a round trip through
an older reader loses nothing.

Layout (all times in milliseconds, all memory in bytes):

- identity: ``name``, ``created``, ``tool_version``, ``command`` (argv of scalpel itself),
  ``target`` (script path or module, and its arguments);
- outcome: ``status`` (``complete`` | ``stopped`` | ``partial`` | ``failed`` | ``interrupted``),
  ``exit_code``, ``error`` (one line), ``notes`` (what the runtime noticed, e.g. "no optimizer");
- ``environment``: facts from :mod:`torchscalpel.envcheck` (python, torch, devices, ...);
- ``config``: the options this run used (warmup, steps, knobs applied);
- ``steps``: one :class:`StepRecord` per step, warm-up steps included and marked;
- ``summary``: medians and shares over the measured steps;
- ``modules``: per-module forward timings when the run asked for them;
- ``profiler``: the profiler window (steps covered, trace path, FLOPs); its op summary (top ops,
  categories, allocator memory) lives once, in ``sections["trace"]``: read it with
  :meth:`RunRecord.op_summary` (records before 1.1 kept a copy in ``profiler``);
- ``provenance`` (1.3): code (git, script and local-module hashes), data fingerprint, seeds;
- ``findings``: doctor findings as dicts (see :mod:`torchscalpel.findings`);
- ``sections``: stage outputs keyed by stage name (``tune``, ``plan``, ``trace``, ...).

The dict parts are stored as plain JSON data; read them through the typed views of
:mod:`torchscalpel.sections` (:meth:`RunRecord.summary_view`, :meth:`~RunRecord.profiler_view`,
:meth:`~RunRecord.config_view`, :meth:`~RunRecord.section`), which keep every key they do not type.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

from torchscalpel.errors import RecordVersionError, ScalpelError, UsageError
from torchscalpel.fileio import atomic_write_text
from torchscalpel.record_schema import MAX_DEPTH, validate_record_data
from torchscalpel.sections import (
    ProfilerSection,
    RunConfig,
    RunSummary,
    StageSection,
    TraceSection,
    check_parts,
)

S = TypeVar("S", bound=StageSection)

RunStatus = Literal["complete", "stopped", "partial", "failed", "interrupted"]
"""How a run ended: ``complete`` (script finished), ``stopped`` (after N steps), ``partial`` (the
default: no outcome set yet), ``failed`` (script raised), ``interrupted`` (Ctrl-C)."""

SCHEMA_VERSION = "1.3"
RECORD_FILENAME = "run.json"

PHASES = ("data", "forward", "backward", "optimizer", "other")
"""The five parts every step is split into; they add up to the step's wall time."""


NOT_TIMED = "every measured step was instrumented (profiled, FLOP-counted or op-line); rerun with more steps"
"""Why a run whose measured steps were all instrumented has no step time (``summary.step_time_not_measured``)."""


@dataclass(kw_only=True, slots=True)
class StepRecord:
    """One optimizer step (or, for inference-only scripts, one root-module forward call)."""

    index: int
    """0-based step number, counting warm-up steps."""
    warmup: bool = False
    """True for steps excluded from the summary."""
    start_ms: float = 0.0
    """Start of the step relative to the start of the script."""
    total_ms: float = 0.0
    """Wall time from the end of the previous step to the end of this one."""
    data_ms: float = 0.0
    """Time spent waiting in DataLoader iterators' ``__next__``."""
    forward_ms: float = 0.0
    """Time inside root-module forward calls."""
    backward_ms: float = 0.0
    """Time inside ``Tensor.backward`` / ``torch.autograd.backward``."""
    optimizer_ms: float = 0.0
    """Time inside ``Optimizer.step`` (from the step pre-hook to the post-hook)."""
    other_ms: float = 0.0
    """Everything else: logging, metric code, loss computation outside modules, zero_grad."""
    loss: float | None = None
    """The step's loss: the sum over its micro-batches of what backward was called on (mean of
    each if it was not a scalar), unscaled by GradScaler; in a closure, the first evaluation's."""
    micro_batches: int = 0
    """Backward calls in this step outside a closure's re-evaluations: more than one means
    gradient accumulation."""
    forward_calls: int = 0
    """Root-model training forward calls in this step (evaluation and recomputation not counted)."""
    samples: int | None = None
    """Samples the step trained on: the sizes of the training DataLoader batches it fetched, else
    the batch dimension of the root model's inputs (dim 1 for sequence-first RNN/Transformer models)."""
    closure_evals: int = 0
    """Loss evaluations inside ``optimizer.step(closure)`` (LBFGS may evaluate several per step)."""
    recomputed_forwards: int = 0
    """Forwards recomputed inside backward (activation checkpointing); their time is backward's."""
    skipped_update: bool = False
    """GradScaler skipped this step's optimizer update (inf or NaN gradients)."""
    cuda_allocated_peak: int | None = None
    """``torch.cuda.max_memory_allocated`` over this step."""
    cuda_reserved_peak: int | None = None
    """``torch.cuda.max_memory_reserved`` over this step."""
    rss: int | None = None
    """Process resident set size at the end of the step."""
    profiled: bool = False
    """True when the step was instrumented, and so is left out of the timing summary: it lies inside
    the torch.profiler window, or it is the FLOP-counting step (``flops_counted``)."""
    flops_counted: bool = False
    """True for the one step whose FLOPs a dispatch mode counted (``profiler.flops_step``)."""
    op_lines: bool = False
    """True for the steps of the op-line pass, which names each op's user line (``profiler.op_lines``);
    written only when true."""
    eval_ms: float = 0.0
    """Time of the evaluation forwards (root forwards without grad once training is expected: a ``test()``
    between steps) that ran in this step's span; part of ``other_ms``. Written only when above 0."""

    @property
    def training_ms(self) -> float:
        """The step's time less its evaluation forwards: what the step's training FLOPs took."""
        return max(self.total_ms - self.eval_ms, 0.0)

    def phase_ms(self) -> dict[str, float]:
        """The five-way split as a dict keyed by :data:`PHASES`."""
        return {
            "data": self.data_ms,
            "forward": self.forward_ms,
            "backward": self.backward_ms,
            "optimizer": self.optimizer_ms,
            "other": self.other_ms,
        }


_inline_html: Callable[[RunRecord], str] | None = None
"""Renders a record's summary as HTML for Jupyter; registered from above (the package root)."""


def set_inline_html(render: Callable[[RunRecord], str] | None) -> None:
    """Register the renderer behind :meth:`RunRecord._repr_html_` (dependency inversion: the record is on
    the bottom floor, the HTML report near the top)."""
    global _inline_html
    _inline_html = render


@dataclass(kw_only=True, slots=True)
class RunRecord:
    """Everything one run measured; see the module docstring for the layout."""

    schema_version: str = SCHEMA_VERSION
    name: str = "run"
    created: str = ""
    tool_version: str = ""
    command: list[str] = field(default_factory=list)
    target: dict[str, Any] = field(default_factory=dict)
    status: RunStatus = "partial"
    exit_code: int | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    step_kind: str = "optimizer"
    """How steps were delimited: ``optimizer`` steps or root ``forward`` calls (inference)."""
    steps: list[StepRecord] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    modules: list[dict[str, Any]] = field(default_factory=list)
    profiler: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    """Schema 1.3: git commit/branch/diff hash, script and local-module hashes, the first batch's
    fingerprint and the seeds seen (:mod:`torchscalpel.runtime.provenance`); {} in older records."""
    artifacts: dict[str, str] = field(default_factory=dict)
    """Files next to run.json, by role (``trace``, ``report``), as paths relative to it."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this reader does not know (written by a newer minor version); saved back as-is."""

    def __repr__(self) -> str:
        """One line (name, status, steps, median step): the dataclass's own repr printed every step and
        section, 35,000 characters in a notebook cell."""
        measured = sum(1 for s in self.steps if not s.warmup)
        median = self.summary.get("median_step_ms") if isinstance(self.summary, dict) else None
        step = (
            f"median step {median:.2f} ms" if isinstance(median, int | float) else "median step not measured"
        )
        return (
            f"RunRecord(name={self.name!r}, status={self.status!r}, steps={len(self.steps)} "
            f"({measured} measured), {step})"
        )

    def _repr_html_(self) -> str | None:
        """Jupyter's rich display: the report's summary sections, inline (None: plain repr).

        The renderer sits floors above the record, so the record does not import it: the package root
        (always loaded before any submodule) registers it with :func:`set_inline_html`."""
        return None if _inline_html is None else _inline_html(self)

    def op_summary(self) -> dict[str, Any]:
        """The profiler window's op summary (``top_ops``, ``categories``, ``memory``, ...).

        The shared trace analysis in ``sections["trace"]``; schema 1.0 records kept copies of
        those three keys in ``profiler`` instead, which are read when the section is absent.
        """
        trace = self.sections.get("trace")
        if trace:
            return trace
        return {k: self.profiler[k] for k in ("top_ops", "categories", "memory") if k in self.profiler}

    def summary_view(self) -> RunSummary:
        """``summary`` typed (every field at its default when the run measured nothing)."""
        return RunSummary.from_dict(self.summary)

    def profiler_view(self) -> ProfilerSection:
        """``profiler`` typed (``steps`` is None when the run had no profiler window)."""
        return ProfilerSection.from_dict(self.profiler)

    def config_view(self) -> RunConfig:
        """``config`` typed (defaults for options a hand-made record leaves out)."""
        return RunConfig.from_dict(self.config)

    def section(self, kind: type[S]) -> S | None:
        """``sections[kind.KEY]`` typed, e.g. ``record.section(TuneSection)``; None when that stage
        left no section (or something other than a JSON object under its key)."""
        data = self.sections.get(kind.KEY)
        return kind.from_dict(data) if isinstance(data, dict) else None

    def op_summary_view(self) -> TraceSection:
        """:meth:`op_summary` typed: empty (no ops, no memory) when the run had no profiler trace."""
        return TraceSection.from_dict(self.op_summary())

    @property
    def measured_steps(self) -> list[StepRecord]:
        """Steps that count: not warm-up."""
        return [s for s in self.steps if not s.warmup]

    @property
    def timed_steps(self) -> list[StepRecord]:
        """The measured steps a step time may come from: those no instrument slowed (not profiled, not
        FLOP-counted, not in the op-line pass). Empty when every measured step was instrumented: the run
        then has no step time (:data:`NOT_TIMED`), never one read from an instrumented step."""
        return [s for s in self.steps if not s.warmup and not s.profiled]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``extra`` keys merged back at the top level)."""
        data = asdict(self)
        if not data["provenance"]:
            del data["provenance"]  # an older or hand-made record round-trips to the same JSON
        for step in data["steps"]:
            if not step["op_lines"]:
                del step["op_lines"]  # only the op-line pass's steps carry the key: older records round-trip
            if not step["eval_ms"]:
                del step["eval_ms"]  # only steps with evaluation forwards in them carry it
        extra = data.pop("extra")
        for key, value in extra.items():
            data.setdefault(key, value)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """Build a record from JSON data, rejecting a newer major schema version."""
        version = str(data.get("schema_version", ""))
        check_schema_version(version, what="run record")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known and k != "extra"}
        kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
        step_fields = {f.name for f in fields(StepRecord)}
        kwargs["steps"] = [
            StepRecord(**{k: v for k, v in s.items() if k in step_fields}) for s in data.get("steps", [])
        ]
        return cls(**kwargs)


def new_run_record(
    name: str,
    *,
    status: RunStatus = "partial",
    command: list[str] | None = None,
    target: dict[str, Any] | None = None,
    environment: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> RunRecord:
    """The one factory of records: stamps ``created`` (:func:`now_timestamp`) and ``tool_version``."""
    from torchscalpel.version import __version__

    return RunRecord(
        name=name,
        created=now_timestamp(),
        tool_version=__version__,
        status=status,
        command=list(command or []),
        target=dict(target or {}),
        environment=dict(environment or {}),
        config=dict(config or {}),
    )


def now_timestamp() -> str:
    """The one timestamp format of records: local time, ISO 8601 with its UTC offset."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def check_schema_version(version: str, *, what: str, supported: str = SCHEMA_VERSION) -> None:
    """Raise :class:`RecordVersionError` if ``version``'s major is newer than ``supported``'s."""
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise RecordVersionError(
            f"This {what} has no readable schema_version ({version!r}); it was not written by torchscalpel."
        ) from None
    if major > int(supported.split(".")[0]):
        raise RecordVersionError(
            f"This {what} has schema version {version}, newer than the {supported} this torchscalpel reads; "
            "upgrade torchscalpel to read it."
        )


def save_record(record: RunRecord, path: str | os.PathLike[str]) -> Path:
    """Write ``record`` as JSON atomically (temp file + rename), so a crash never leaves half a file."""
    target = Path(path)
    if target.is_dir():
        target = target / RECORD_FILENAME
    atomic_write_text(target, record_json(record))
    return target


def record_json(record: RunRecord) -> str:
    """``record`` as the JSON text :func:`save_record` writes (for a copy written elsewhere, e.g. ``--json``)."""
    return json.dumps(record.to_dict(), indent=1, default=_json_default, allow_nan=True) + "\n"


def load_record(path: str | os.PathLike[str]) -> RunRecord:
    """Read a record from ``run.json`` or from the run folder that holds it.

    The JSON is checked against the schema before anything reads it (:func:`validate_record_data`):
    a hand-made or damaged file is refused in one sentence naming the field (:class:`UsageError`,
    exit 2) instead of raising deep inside a renderer."""
    source = Path(path)
    if source.is_dir():
        source = source / RECORD_FILENAME
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScalpelError(f"No run record at {source}; pass a run folder or its run.json.") from None
    except UnicodeDecodeError:
        raise UsageError(f"{source} is not a run record (it is not UTF-8 text).") from None
    except OSError as exc:
        raise UsageError(f"Cannot read the run record {source}: {exc.strerror or exc}.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno}).") from None
    except RecursionError:  # json's C decoder recurses once per nesting level
        raise UsageError(
            f"{source} is not a run record: its JSON nests deeper than {MAX_DEPTH} levels."
        ) from None
    except ValueError:  # an integer longer than Python's 4300-digit limit for int(str)
        raise UsageError(
            f"{source} is not a run record: it holds an integer of over 4300 digits, beyond 64 bits."
        ) from None
    if not isinstance(data, dict):
        raise UsageError(f"{source} does not hold a run record (expected a JSON object).")
    # The schema (top-level types, steps, bounds), then what the renderers and fix read of each part (types and
    # ranges): a record that loads renders and patches without a traceback.
    problem = validate_record_data(data) or check_parts(data)
    if problem is not None:
        raise UsageError(f"{source} is not a valid run record: {problem}.")
    return RunRecord.from_dict(data)


def _json_default(value: Any) -> Any:
    """Serialise the few non-JSON types stages put into records (paths, numpy scalars, sets)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in a run record")

"""Typed views of the Run record's dict parts: ``summary``, ``profiler``, ``config`` and the stage
sections (``sections["trace"]``, ``["tune"]``, ``["plan"]``, ``["doctor"]``, ``["lr"]``, ``["batch"]``,
``["memory"]``, ...), one definition each; a renderer reads a view, never the raw dict.

The record stores plain JSON data (so schema 1.0-1.2 files load unchanged and doctor's rules may
keep reading dicts); readers take a view instead of digging by key, so a misspelled key is an
``AttributeError`` (the classes have slots) rather than a silent ``None``::

    s = record.summary_view()          # RunSummary; defaults when the run measured nothing
    tune = record.section(TuneSection)  # TuneSection, or None when tune did not run

A view is lossless: :meth:`SectionView.from_dict` keeps keys it does not type in ``extra`` and
remembers the order of the keys it read, so ``from_dict(d).to_dict() == d`` with the same key
order (the same JSON). A field absent from the source dict is written back only when its value
differs from the field's default (or the class lists it in ``ALWAYS``). Views share the record's
nested lists and dicts; to change the record, write ``to_dict()`` back.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints

from torchscalpel.units import fmt_bytes

V = TypeVar("V", bound="SectionView")

Check = Callable[[Any, str], "str | None"]
"""A check of one value read at ``where`` (``sections.batch.rows[2].samples_per_s``): None when it fits, else
the clause that refuses it (``sections.batch.rows[2].samples_per_s must be a finite number >= 0, not 'x'``)."""

DEVICE_TYPES = frozenset(
    {"cpu", "cuda", "xpu", "mps", "hpu", "mtia", "maia", "xla", "ipu", "meta", "privateuseone"}
)
"""torch device types a recorded forward may have run on (``torch.autocast``'s ``device_type``)."""
MAX_PATH = 4096
"""Longest path a record may name (Linux's PATH_MAX)."""


def shown(value: Any) -> str:
    """``value`` as a refusal quotes it: its repr (ASCII-safe for a lone surrogate), clipped to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def must(where: str, expected: str, value: Any) -> str:
    """The one refusal clause every check of a record value gives."""
    return f"{where} must be {expected}, not {shown(value)}"


def is_int(value: Any) -> bool:
    """A JSON integer (``true`` is no count: bool is an int only in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A JSON number, finite (NaN and infinity are no measurement a renderer can place)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def scalar(test: Callable[[Any], bool], expected: str, *, nullable: bool = True) -> Check:
    """A check of one JSON value by ``test``; null passes when ``nullable`` (readers take it as absent)."""

    def check(value: Any, where: str) -> str | None:
        if value is None and nullable:
            return None
        return None if test(value) else must(where, expected, value)

    return check


def required(check: Check) -> Check:
    """``check`` with null refused (a reader indexes or formats the value without a None case)."""

    def strict(value: Any, where: str) -> str | None:
        return check(value, where) if value is not None else must(where, "present", value)

    return strict


ANY: Check = lambda value, where: None  # noqa: E731 (a constant check, named like the others)
TEXT = scalar(lambda v: isinstance(v, str), "a string")
FLAG = scalar(lambda v: isinstance(v, bool), "true or false")
INT = scalar(is_int, "an integer")
COUNT = scalar(
    lambda v: (is_int(v) or (is_number(v) and float(v).is_integer())) and v >= 0, "an integer >= 0"
)
"""Counts, sizes, indices: a writer may have stored a whole number as a float (``4000000000.0`` FLOPs)."""
NUMBER = scalar(is_number, "a finite number")
AMOUNT = scalar(lambda v: is_number(v) and v >= 0, "a finite number >= 0")
"""Times, rates, bytes, FLOPs, shares: what a renderer scales, sums or draws."""
LOSS = scalar(lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number")
"""A loss, what is computed from one, or an lr a sweep ran past: NaN or infinity is a fact about a diverged
script (a renderer shows it as such; ``report --check`` lets a loss be NaN)."""
PATH = scalar(lambda v: isinstance(v, str) and 0 < len(v) <= MAX_PATH and "\0" not in v, "a file path")
LINE = scalar(lambda v: is_int(v) and v >= 1, "a line number (an integer >= 1)")


def list_of(item: Check, *, nullable: bool = True) -> Check:
    """A JSON list whose every item passes ``item``."""

    def check(value: Any, where: str) -> str | None:
        if value is None and nullable:
            return None
        if not isinstance(value, list):
            return must(where, "a list", value)
        for i, x in enumerate(value):
            problem = item(x, f"{where}[{i}]")
            if problem is not None:
                return problem
        return None

    return check


def dict_of(item: Check, *, nullable: bool = True) -> Check:
    """A JSON object whose every value passes ``item`` (keys are free)."""

    def check(value: Any, where: str) -> str | None:
        if value is None and nullable:
            return None
        if not isinstance(value, dict):
            return must(where, "an object", value)
        for key, x in value.items():
            problem = item(x, f"{where}.{str(key)[:40]}")
            if problem is not None:
                return problem
        return None

    return check


def obj(fields_: Mapping[str, Check], *, nullable: bool = True, needs: tuple[str, ...] = ()) -> Check:
    """A JSON object whose listed keys, where present, pass their checks (keys in ``needs`` must be there:
    the renderers index them); other keys are free (a newer writer's)."""

    def check(value: Any, where: str) -> str | None:
        if value is None and nullable:
            return None
        if not isinstance(value, dict):
            return must(where, "an object", value)
        for key, test in fields_.items():
            if key in value:
                problem = test(value[key], f"{where}.{key}")
                if problem is not None:
                    return problem
        for key in needs:
            if key not in value:
                return f"{where}.{key} is missing"
        return None

    return check


def rows(fields_: Mapping[str, Check], *, needs: tuple[str, ...] = ()) -> Check:
    """A list of JSON objects, each checked as :func:`obj` checks one (null items refused: readers call
    ``.get`` on each)."""
    return list_of(obj(fields_, nullable=False, needs=needs))


def _from_annotation(hint: Any) -> Check:
    """The check a field's annotation declares: ``int`` an integer >= 0, ``float`` a finite number >= 0 (a
    field that may be negative or NaN says so in ``CHECKS``), ``X | None`` nullable, ``list[X]``,
    ``dict[str, X]``; ``Any`` unchecked."""
    if hint is Any:
        return ANY
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        nullable = type(None) in args
        parts = [_from_annotation(a) for a in args if a is not type(None)]
        if len(parts) == 1:
            inner = parts[0]
            return lambda v, where: None if v is None and nullable else inner(v, where)
        names = " or ".join(_NAMES.get(a, "a value") for a in args if a is not type(None))

        def either(value: Any, where: str) -> str | None:
            if value is None and nullable:
                return None
            if any(p(value, where) is None for p in parts):
                return None
            return must(where, names, value)

        return either
    if origin is list:
        return list_of(_from_annotation(args[0]), nullable=False)
    if origin is dict:
        return dict_of(_from_annotation(args[1]), nullable=False)
    plain = {bool: FLAG, int: COUNT, float: AMOUNT, str: TEXT}.get(hint)
    if plain is None:
        return ANY
    return required(plain)


_NAMES = {int: "an integer", str: "a string", float: "a number", bool: "true or false"}

_BASE_FIELDS = ("extra", "_keys")


@dataclass(kw_only=True, slots=True)
class SectionView:
    """The lossless from_dict / to_dict every typed part of the record shares."""

    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    """Keys this reader does not type (written by another stage or a newer version); kept as-is."""
    _keys: tuple[str, ...] = field(default=(), repr=False, compare=False)
    """The keys of the dict this view was read from, in order; :meth:`to_dict` writes them in it."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset()
    """Fields written even when they hold their default (the writer has always written them)."""
    CHECKS: ClassVar[Mapping[str, Check]] = {}
    """Checks that say more than a field's annotation (ranges, NaN allowed, the shape of its rows); every
    other typed field is checked as its annotation declares (:func:`_from_annotation`)."""

    @classmethod
    def problem(cls, data: Any, where: str) -> str | None:
        """The first value of ``data`` (this part of a record, read at ``where``) that does not fit its field's
        declared type and range, as one clause naming it; None when all fit. Absent keys and keys this class
        does not type pass: an older writer left them out, a newer one added them."""
        if not isinstance(data, dict):
            return must(where, "an object", data)
        for key, check in _checks(cls).items():
            if key in data:
                problem = check(data[key], f"{where}.{key}")
                if problem is not None:
                    return problem
        return None

    @classmethod
    def typed_keys(cls) -> tuple[str, ...]:
        """The keys this class types, in field order."""
        return tuple(f.name for f in fields(cls) if f.name not in _BASE_FIELDS)

    @classmethod
    def from_dict(cls: type[V], data: Mapping[str, Any] | None) -> V:
        """A view of ``data`` (None or empty: every field at its default)."""
        data = data or {}
        typed = set(cls.typed_keys())
        return cls(
            **{k: v for k, v in data.items() if k in typed},
            extra={k: v for k, v in data.items() if k not in typed},
            _keys=tuple(data),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data: the source's keys in their order, then set fields, then new extra keys."""
        typed = self.typed_keys()
        out: dict[str, Any] = {}
        for key in self._keys:
            if key in typed:
                out[key] = getattr(self, key)
            elif key in self.extra:
                out[key] = self.extra[key]
        defaults = _defaults(type(self))
        for name in typed:
            if name in out:
                continue
            value = getattr(self, name)
            if name in self.ALWAYS or value != defaults[name]:
                out[name] = value
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


_CHECK_CACHE: dict[type, dict[str, Check]] = {}


def _checks(cls: type[SectionView]) -> dict[str, Check]:
    """Each typed key's check (``CHECKS`` first, else the annotation's), built once per class."""
    if cls not in _CHECK_CACHE:
        hints = get_type_hints(cls)
        checks: dict[str, Check] = {}
        for name in cls.typed_keys():
            declared = cls.CHECKS.get(name)
            if declared is None:
                checks[name] = _from_annotation(hints[name])
            elif type(None) in get_args(hints[name]) or hints[name] is Any:
                checks[name] = declared
            else:  # a field whose annotation has no None: null is refused whatever CHECKS says
                checks[name] = required(declared)
        _CHECK_CACHE[cls] = checks
    return _CHECK_CACHE[cls]


def _defaults(cls: type[SectionView]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


_PAIR = scalar(
    lambda v: isinstance(v, list) and len(v) == 2 and all(is_number(x) and x >= 0 for x in v),
    "a pair of step times [baseline ms, candidate ms]",
)
TRIAL_STATUSES = frozenset(
    {"ok", "failed", "timeout", "not applied", "skipped", "not run", "not-applied", "not-run"}
)
"""``TrialStatus`` values (:mod:`torchscalpel.tune.states`, the older spellings included); a test keeps them equal."""
TRIAL_VERDICTS = frozenset(
    {
        "",
        "baseline",
        "winner",
        "not confirmed",
        "faster",
        "not faster",
        "numerics",
        "failed",
        "timeout",
        "skipped",
        "not applied",
        "not run",
    }
)
"""``Verdict`` values (:mod:`torchscalpel.tune.states`); a test keeps them equal."""
_NAMED = list_of(obj({}, nullable=False))
"""A list of objects the renderers read with ``.get`` (their values are shown as text)."""
_COMPILE = obj(
    {
        "compile_ms": AMOUNT,
        "excluded": _NAMED,
        "fullgraph": obj({}),
        "breaks": _NAMED,
        "graph_breaks": COUNT,
        "break_reasons": list_of(TEXT),
        "recompile_guards": _NAMED,
        "recompiles": COUNT,
        "recompile_reasons": list_of(TEXT),
    }
)
"""A trial's compile triage (:mod:`torchscalpel.tune.triage`), as the table's ``compile`` and ``result`` cells
read it."""
_PAYBACK = obj(
    {
        "end_to_end": AMOUNT,
        "steps": COUNT,
        "run_steps": COUNT,
        "one_time_s": AMOUNT,
        "sentence": TEXT,
        "kind": TEXT,
    }
)
"""A trial's start-up cost against its per-step gain (:meth:`torchscalpel.tune.payback.Payback.to_dict`)."""
_TRIAL: dict[str, Check] = {
    "label": TEXT,
    "family": TEXT,
    "verdict": scalar(lambda v: isinstance(v, str) and v in TRIAL_VERDICTS, "a tune verdict"),
    "status": scalar(lambda v: isinstance(v, str) and v in TRIAL_STATUSES, "a trial status"),
    "cause": TEXT,
    "note": TEXT,
    "reason": TEXT,
    "reason_short": TEXT,
    "peak_bytes": COUNT,
    "deviation": LOSS,
    "losses": list_of(LOSS),
    "compile": _COMPILE,
    "payback": _PAYBACK,
    "median_ms": AMOUNT,
    "baseline_ms": AMOUNT,
    "speedup": AMOUNT,
    "speedup_pair": _PAIR,
    "confirm_pairs": list_of(required(_PAIR)),
    "confirm_ratios": list_of(AMOUNT),
    "settings": obj({}),
}
"""What tune's renderers and ``scalpel fix`` read of a trial (baseline, each trial, the winner)."""
_PLAN_ROW_NEEDS = ("strategy",)
_PLAN_ROW: dict[str, Check] = {
    "strategy": required(TEXT),
    "fits": FLAG,
    "max_batch": COUNT,
    "phase": TEXT,
    # the chart's parts are read with .get(key, 0): present, they must be numbers
    **{key: required(AMOUNT) for key in ("params", "grads", "optim", "activations", "comm", "margin")},
    **{key: AMOUNT for key in ("peak", "needed", "capacity", "weights_optimizer_rule")},
    "headroom": NUMBER,
}
"""One strategy of a plan, as :meth:`torchscalpel.plan.planner.Plan.to_dict` writes it (headroom is
negative when it does not fit)."""
SITE_FIELDS: dict[str, Check] = {
    "file": PATH,
    "line": LINE,
    "class": TEXT,
    "library": TEXT,
    "used": FLAG,
    "autocast": FLAG,
    "device": TEXT,  # which names fix may write into code (DEVICE_TYPES) is fix's check, not every reader's
    "input_dims": scalar(
        lambda v: isinstance(v, list) and all(d is None or (is_int(d) and d >= 0) for d in v),
        "a list of tensor dimensions",
    ),
}
"""A recorded site (:mod:`torchscalpel.runtime.sites`): the types every reader relies on. What ``scalpel fix``
writes into code from it (``class`` a dotted name, ``device`` one of :data:`DEVICE_TYPES`) it checks itself
(:mod:`torchscalpel.fix.record_values`): a name outside those sets is text to a renderer."""


@dataclass(kw_only=True, slots=True)
class RunSummary(SectionView):
    """``record.summary``: medians and shares over the measured, unprofiled steps (written by
    :func:`torchscalpel.runtime.summary.summarize`). None: the run had nothing to compute it from."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"steps_total", "steps_measured", "steps_summarized"})
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "first_loss": LOSS,
        "last_loss": LOSS,
        "mfu": obj({"gpu": TEXT, "peak_tflops_bf16": AMOUNT, "mfu": required(AMOUNT)}, needs=("gpu", "mfu")),
        "flops_uncounted": rows({"name": required(TEXT), "share": required(AMOUNT)}, needs=("name", "share")),
    }

    steps_total: int = 0
    """Steps recorded, warm-up included."""
    steps_measured: int = 0
    """Steps after warm-up."""
    steps_summarized: int = 0
    """Measured steps the statistics cover (profiled ones left out when others exist)."""
    median_step_ms: float | None = None
    mean_step_ms: float | None = None
    min_step_ms: float | None = None
    p90_step_ms: float | None = None
    phase_mean_ms: dict[str, float] | None = None
    """Mean time per phase (keys: :data:`torchscalpel.record.PHASES`); they sum to ``mean_step_ms``."""
    phase_share: dict[str, float] | None = None
    """Each phase's share of the mean step (the share of ``phase_mean_ms``)."""
    breakdown_max_error: float | None = None
    """Largest per-step gap between the phase sum and the step time, as a fraction of the step."""
    samples_per_s: float | None = None
    samples_per_s_not_measured: str | None = None
    """Why ``samples_per_s`` is None on a run that measured steps (shown as "not measured: <reason>")."""
    first_loss: float | None = None
    last_loss: float | None = None
    rss_peak: int | None = None
    cuda_allocated_peak: int | None = None
    cuda_reserved_peak: int | None = None
    flops_per_step: float | None = None
    """Model FLOPs of one training step (forward, backward, optimizer), counted with
    FlopCounterMode's formulas over the FLOP-counting step; checkpoint recomputation not included."""
    achieved_flops_per_s: float | None = None
    """``flops_per_step`` over the median step time (over ``training_step_ms`` when steps held evaluation)."""
    training_step_ms: float | None = None
    """The median of the steps' time less their evaluation forwards (``StepRecord.eval_ms``); written only
    when some step held evaluation. What the training FLOPs took: FLOP/s and MFU are over it."""
    mfu: dict[str, Any] | None = None
    """``gpu``, ``peak_tflops_bf16``, ``mfu`` (fraction) when the device's peak is known."""
    recompute_flops_per_step: float | None = None
    """FLOPs of forwards recomputed inside backward (activation checkpointing), apart from the model's."""
    flops_not_measured: str | None = None
    """Why ``flops_per_step`` is missing when the run had a FLOP-counting window."""
    eval_flops: float | None = None
    """FLOPs of evaluation forwards (without grad, between training steps: a ``test()`` after each step) that
    ran inside the FLOP-counting window: counted apart, never in ``flops_per_step``."""
    flops_uncounted: list[dict[str, Any]] = field(default_factory=list)
    """Ops with no FLOP formula that took more than :data:`torchscalpel.runtime.summary.UNCOUNTED_SHARE` of
    the profiled op time (``name``, ``share`` of op self time): work ``flops_per_step`` leaves out."""
    step_time_not_measured: str | None = None
    """Why there is no step time though steps were measured (every measured step was instrumented)."""
    phase_median_ms: dict[str, float] | None = None
    """Median time per phase over the same steps as ``median_step_ms`` (need not sum to it)."""
    phase_median_share: dict[str, float] | None = None
    """Each phase's median over the median step: the share shown beside ``phase_median_ms``."""


@dataclass(kw_only=True, slots=True)
class ProfilerSection(SectionView):
    """``record.profiler``: the torch.profiler window (its op summary is ``sections["trace"]``;
    schema 1.0 copies of ``top_ops``/``categories``/``memory`` stay in ``extra``)."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"steps", "trace"})
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "flops_by_op": rows({"name": TEXT, "count": COUNT, "flops": AMOUNT, "recompute": AMOUNT}),
        "op_lines": obj(
            {
                "seconds": AMOUNT,
                "step_ms": AMOUNT,
                "error": TEXT,
                "ops": list_of(
                    obj(
                        {
                            "name": required(TEXT),
                            "site": TEXT,
                            "site_share": required(AMOUNT),
                            "calls": COUNT,
                            "self_us": AMOUNT,
                            "library_site": TEXT,
                        },
                        nullable=False,
                        needs=("name", "site_share"),
                    ),
                    nullable=False,
                ),
            }
        ),
    }

    steps: list[int] | None = None
    """Indices of the profiled steps; None: the run had no profiler window."""
    trace: str | None = None
    """The exported trace's file name, next to run.json."""
    flops_step: int | None = None
    """The step whose FLOPs were counted (schema 1.3 records without it counted the profiled steps
    with the profiler's ``with_flops``, which missed backward)."""
    flops_total: int | None = None
    """Model FLOPs of ``flops_step``: the sum of ``flops`` over ``flops_by_op``."""
    flops_recompute: int | None = None
    """Checkpoint recomputation FLOPs of ``flops_step``: the sum of ``recompute`` over ``flops_by_op``."""
    flops_unformulated: list[str] = field(default_factory=list)
    """Ops ``flops_step`` ran that have no FLOP formula yet may do matmul-like work (not elementwise, norm,
    copy, view, ...): their share of op time is ``summary.flops_uncounted``."""
    flops_eval: int | None = None
    """FLOPs of evaluation forwards that ran while ``flops_step`` was counted (between the previous step's end
    and its own): not in ``flops_total``."""
    flops_by_op: list[dict[str, Any]] = field(default_factory=list)
    """``name`` (``aten::mm``), ``count`` (calls), ``flops`` (model), ``recompute``: every op that counted."""
    flops_not_measured: str | None = None
    """Why no FLOPs were counted (the script ended first, no step left beside the window, ...)."""
    event_budget: int | None = None
    """Trace events the window was allowed (``--profile-budget``)."""
    events_per_step_estimate: int | None = None
    """A step's trace events, estimated from the ops the FLOP-counting step dispatched."""
    bounded: str | None = None
    """What the budget made the window do (fewer steps, no shapes/memory, a step cut short, none)."""
    error: str | None = None
    """Why the profiler window failed, when it did."""
    op_lines: dict[str, Any] | None = None
    """The op-line pass (``runtime/op_lines.py``): ``steps``, ``seconds`` (its cost: the steps and reading
    them back), ``step_ms``, ``ops`` (per top op: ``name``, ``site`` file:line, ``site_share``, ``calls``,
    ``self_us``, ``shapes``, ``library_site``: an installed package's file:line that made the calls, or None)
    and ``error`` when it could not run; None: not asked."""


@dataclass(kw_only=True, slots=True)
class RunConfig(SectionView):
    """``record.config``: the options the run used (knobs a stage adds stay in ``extra``)."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset(
        {"warmup", "steps", "profile_steps", "module_times", "step_kind"}
    )

    warmup: int = 0
    steps: int | None = None
    """Measured steps asked for; None: the script ran to its end."""
    profile_steps: int = 0
    module_times: bool = False
    step_kind: str | None = None
    """The ``--step-kind`` asked for (the kind used is ``record.step_kind``)."""
    device: str | None = None
    clock: str | None = None
    """The timing clock (``cuda-events``, ``perf_counter``, ...)."""
    stopped_by: dict[str, Any] | None = None
    """Why the runtime stopped the script: ``kind`` (steps, time-cap, divergence, memory-limit, no-step,
    asked), ``reason`` (its words) and ``cap_s`` for a time cap; None when the script ended on its own
    (read by :func:`torchscalpel.runtime.run_notes.how_it_stopped`)."""


@dataclass(kw_only=True, slots=True)
class StageSection(SectionView):
    """A stage's output in ``record.sections[KEY]``; read with ``record.section(cls)``."""

    KEY: ClassVar[str] = ""


@dataclass(kw_only=True, slots=True)
class TraceSection(StageSection):
    """``sections["trace"]``: the shared trace analysis of the profiler window
    (:meth:`torchscalpel.trace.analyze.TraceAnalysis.to_dict`)."""

    KEY: ClassVar[str] = "trace"
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "top_ops": rows(
            {
                "name": required(TEXT),
                "category": TEXT,
                "self_us": required(AMOUNT),
                "total_us": AMOUNT,
                "count": COUNT,
            },
            needs=("name", "self_us"),
        ),
        "top_kernels": rows(
            {"name": required(TEXT), "category": TEXT, "total_us": AMOUNT, "count": COUNT}, needs=("name",)
        ),
        "memory": obj({"peak_bytes": AMOUNT}),
    }

    schema: str | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    top_kernels: list[dict[str, Any]] = field(default_factory=list)
    categories: dict[str, float] = field(default_factory=dict)
    """CPU op self time (µs) by category."""
    gpu_categories: dict[str, float] = field(default_factory=dict)
    memory: dict[str, Any] | None = None
    """Allocator memory over the window (``peak_bytes``, ...)."""
    stragglers: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    complete: bool | None = None
    op_table: dict[str, list[float]] = field(default_factory=dict)
    kernel_table: dict[str, list[float]] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class TuneSection(StageSection):
    """``sections["tune"]`` (:meth:`torchscalpel.tune.search.TuneResult.to_dict`)."""

    KEY: ClassVar[str] = "tune"
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "baseline": obj(_TRIAL),
        "trials": rows(_TRIAL),
        "winner": obj(_TRIAL),
        # cpu_isa decides the CPU max-autotune candidate (tune/knobs/compile.py): text, never code
        "facts": obj(
            {
                "repeated": rows({"cls": TEXT}),
                "cpu_isa": TEXT,
                "bottleneck": obj(
                    {"kind": TEXT, "also": list_of(TEXT), "evidence": dict_of(TEXT), "device": TEXT}
                ),
            }
        ),
    }

    baseline: dict[str, Any] | None = None
    """The baseline trial (``TrialResult.to_dict``)."""
    trials: list[dict[str, Any]] = field(default_factory=list)
    winner: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    code_lines: list[str] = field(default_factory=list)
    confirmed_speedup: float | None = None
    required_speedup: float | None = None
    """None only in a hand-made section (readers then use tune's own margin)."""
    noise: float | None = 0.0
    """None when one plain baseline run left nothing to measure it over."""
    determinism: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float | None = None
    interrupted: bool = False
    baseline_refs: list[float] = field(default_factory=list)
    measured_steps: int | None = None
    baseline_medians: list[float] = field(default_factory=list)
    """Every plain baseline run's median step time, in order: what ``noise`` is over."""
    no_candidate: str = ""
    """Why no candidate was measured (empty when one was)."""


@dataclass(kw_only=True, slots=True)
class PlanSection(StageSection):
    """``sections["plan"]`` (:meth:`torchscalpel.plan.planner.Plan.to_dict`)."""

    KEY: ClassVar[str] = "plan"
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "version": ANY,
        "batch_dims": ANY,
        "rows": rows(_PLAN_ROW, needs=_PLAN_ROW_NEEDS),
        "alternatives": rows(_PLAN_ROW, needs=_PLAN_ROW_NEEDS),
        "device": obj({"name": TEXT, "capacity": AMOUNT}),
        "fsdp": obj(
            {
                "api": TEXT,
                "sharding": TEXT,
                "site": TEXT,
                "strategy": TEXT,
                "param_dtype": TEXT,
                "cpu_offload": FLAG,
                "ignored_bytes": COUNT,
            }
        ),
    }

    version: int | str | None = None
    model: str | None = None
    batch: str | None = None
    batch_size: int | None = None
    batch_dims: Any = None
    optimizer: str | None = None
    precision: str | None = None
    grad_accum: int | None = None
    world_size: int | None = None
    nodes: int | None = None
    checkpointing: Any = None
    device: dict[str, Any] = field(default_factory=dict)
    measurement: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    """One per strategy: ``strategy``, ``peak``, ``needed``, ``capacity``, ``fits``, ... (bytes)."""
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    recommended: str | None = None
    recommendation: str = ""
    act_peak_other_checkpointing: int | None = None
    fsdp: dict[str, Any] | None = None
    """The script's own FSDP wrap the rows follow (FSDP1 or FSDP2): ``api``, ``sharding``, ``site``,
    ``strategy``, ``param_dtype``, ``cpu_offload``, ``ignored_modules``, ``ignored_bytes``; None without one."""

    @property
    def wrap_sentence(self) -> str | None:
        """What the script's FSDP wrap asked and where, as the rows plan it: one sentence for the terminal and
        the page alike (None when the script wraps nothing)."""
        wrap = self.fsdp
        if not wrap:
            return None
        parts = [str(wrap.get("sharding"))]
        if wrap.get("param_dtype"):
            parts.append(f"param_dtype {wrap['param_dtype']}")
        if wrap.get("cpu_offload"):
            host = max((_count(r.get("host")) or 0 for r in [*self.rows, *self.alternatives]), default=0)
            parts.append(f"CPU offload: {fmt_bytes(host)} of sharded states in host memory, not in the rows")
        if wrap.get("ignored_modules"):
            ignored = ", ".join(map(str, wrap["ignored_modules"]))
            parts.append(f"unsharded: {ignored} ({fmt_bytes(_count(wrap.get('ignored_bytes')) or 0)})")
        return (
            f"the script shards with {wrap.get('api')}({', '.join(parts)}) at {wrap.get('site')}: "
            f"planned as {wrap.get('strategy')}"
        )


@dataclass(kw_only=True, slots=True)
class DoctorSection(StageSection):
    """``sections["doctor"]``: what the doctor run covered (its findings are ``record.findings``)."""

    KEY: ClassVar[str] = "doctor"

    rules_run: int = 0
    static_files: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    sanity: bool = False
    notes: list[str] = field(default_factory=list)
    hint: Any = None


@dataclass(kw_only=True, slots=True)
class LrSection(StageSection):
    """``sections["lr"]``: a learning-rate range test (``scalpel lr``, :mod:`torchscalpel.lrfind`)."""

    KEY: ClassVar[str] = "lr"
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "points": rows({"step": COUNT, "lr": LOSS, "loss": LOSS, "smoothed": LOSS}),
        "suggestion": obj({"lr": LOSS, "step": COUNT, "smoothed": LOSS, "slope": LOSS}),
        "min_over_10": obj({"lr": LOSS, "step": COUNT, "min_lr": LOSS, "smoothed": LOSS}),
        "divergence": obj({"lr": LOSS, "step": COUNT, "smoothed": LOSS, "min_smoothed": LOSS}),
    }

    min_lr: float | None = None
    max_lr: float | None = None
    steps: int | None = None
    """Steps the sweep asked for (the run stops earlier when the loss diverges or the script ends)."""
    smoothing: float | None = None
    divergence_factor: float | None = None
    points: list[dict[str, Any]] = field(default_factory=list)
    """One per optimizer step: ``step``, ``lr`` (set before it), ``loss``, ``smoothed`` (None when not finite)."""
    steps_run: int | None = None
    """Points the sweep ran (``len(points)``); None in records written before it was kept."""
    reached_lr: float | None = None
    """The last lr swept; None when no point was."""
    range_share: float | None = None
    """The share of ``min_lr -> max_lr`` swept, on a log scale (0 to 1)."""
    suggestion: dict[str, Any] | None = None
    """``lr``, ``step``, ``smoothed``, ``slope`` (per ln lr) at the steepest descent; None when there is none
    (``not_measured`` says why when the sweep did not measure the curve, ``note`` when the curve never fell)."""
    min_over_10: dict[str, Any] | None = None
    """fastai's other rule: ``lr`` (the smoothed minimum's lr / 10), ``step``, ``min_lr`` and ``smoothed`` at the
    minimum (:func:`torchscalpel.lrfind.sweep.min_over_10`); None when no point counts. Trains better than
    ``suggestion`` on the benchmark corpus (BENCHMARKS.md)."""
    divergence: dict[str, Any] | None = None
    """``lr``, ``step``, ``smoothed``, ``min_smoothed`` where the smoothed loss passed the factor; None when it never did."""
    optimizers: int = 0
    param_groups: int = 0
    script_lrs: list[float] = field(default_factory=list)
    """Each param group's lr as the script set it, before the sweep wrote its own (the lr the verdict compares
    against); empty in records written before it was kept."""
    scheduler_steps_suspended: int = 0
    not_measured: str | None = None
    """Why neither suggestion was measured: the sweep neither reached ``max_lr`` nor diverged (how far it got),
    or swept nothing (the script never stepped an optimizer, saw no loss, or ended first); None when it measured."""
    to_measure: str | None = None
    """How to give a short sweep the steps it needs (the script's own arguments, ``--steps``); None otherwise."""
    note: str = ""
    """Why a sweep that measured its curve gives no suggestion (too few points, the loss never fell); empty
    otherwise (records before ``not_measured`` put every reason here)."""


@dataclass(kw_only=True, slots=True)
class BatchSection(StageSection):
    """``sections["batch"]``: samples/s per batch size (``scalpel batch``, :mod:`torchscalpel.tune.batch_finder`)."""

    KEY: ClassVar[str] = "batch"
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "rows": rows(
            {
                "batch_size": required(COUNT),
                "fits": FLAG,
                "samples_per_s": AMOUNT,
                "median_step_ms": AMOUNT,
                "steps_measured": COUNT,
                "why": TEXT,
                "outcome": TEXT,
            },
            needs=("batch_size",),
        ),
    }

    sizes: list[int] = field(default_factory=list)
    steps: int | None = None
    warmup: int | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    """One per size: ``batch_size``, ``fits`` (None: not measured, no DataLoader took the size), ``samples_per_s``,
    ``median_step_ms`` (None when it did not fit or was not measured), ``steps_measured``, ``why``."""
    best: int | None = None
    script_batch_size: int | None = None
    """The batch size the script's first DataLoader asked for."""
    optimizer: str | None = None
    advice: str = ""
    """The lr scaling rule for moving to ``best`` (linear for SGD, square root for Adam): advice, never applied."""
    loaders_untouched: int = 0


@dataclass(kw_only=True, slots=True)
class EvalSection(StageSection):
    """``sections["eval"]``: the loss of each evaluation pass (:mod:`torchscalpel.runtime.eval_loss`), what the
    validation curve, its verdicts (doctor's ``val-loss-*`` rules) and the trackers' ``eval/loss`` read."""

    KEY: ClassVar[str] = "eval"
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "passes": rows(
            {"step": required(COUNT), "loss": LOSS, "batches": required(COUNT)},
            needs=("step", "loss", "batches"),
        ),
        "site": obj({"file": required(PATH), "line": required(LINE)}, needs=("file", "line")),
    }

    passes: list[dict[str, Any]] = field(default_factory=list)
    """One per evaluation pass, in run order: ``step`` (training steps done before it), ``loss`` (the mean of its
    loss calls; None when not finite), ``batches`` (loss calls averaged)."""
    functions: list[str] = field(default_factory=list)
    """The ``torch.nn.functional`` losses the evaluation called."""
    site: dict[str, Any] | None = None
    """``file`` and ``line`` of the first evaluation loss in the user's code."""


@dataclass(kw_only=True, slots=True)
class SitesSection(StageSection):
    """``sections["sites"]``: where the run built its optimizers, DataLoaders and model and called forward
    and backward (:class:`torchscalpel.runtime.sites.SitesObserver`); what ``scalpel fix`` edits.
    A site is ``{"file", "line", "class", "library", "used"}`` (see the observer's doc)."""

    KEY: ClassVar[str] = "sites"
    ALWAYS: ClassVar[frozenset[str]] = frozenset({"optimizers", "dataloaders"})
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "optimizers": rows(SITE_FIELDS),
        "dataloaders": rows(SITE_FIELDS),
        **{key: obj(SITE_FIELDS) for key in ("model", "forward", "backward", "step", "block", "accelerator")},
    }

    optimizers: list[dict[str, Any]] = field(default_factory=list)
    """Every optimizer the run built (16 at most), in construction order; ``used``: it stepped."""
    dataloaders: list[dict[str, Any]] = field(default_factory=list)
    """Every DataLoader the run built (16 at most); ``used``: it yielded a batch."""
    model: dict[str, Any] | None = None
    """Where the module that ran the first training forward was built."""
    forward: dict[str, Any] | None = None
    """The first training forward's call site, with ``autocast`` (active then) and ``device``."""
    backward: dict[str, Any] | None = None
    """The first backward call's site."""
    step: dict[str, Any] | None = None
    """The first ``optimizer.step()`` call's site (``class``: the optimizer's); where memory's
    ``zero_grad(set_to_none=True)`` and fp16's ``scaler.step`` go."""
    block: dict[str, Any] | None = None
    """The first training call of the model's repeated block (``class``): the line activation
    checkpointing wraps; ``library`` set when torch or a package made the call."""
    accelerator: dict[str, Any] | None = None
    """Where the script built its ``accelerate.Accelerator`` (None: it built none)."""


_BYTES = scalar(
    lambda v: (is_int(v) or (is_number(v) and float(v).is_integer())) and v >= 0,
    "a byte count (an integer >= 0)",
)
_NAMED_BYTES = list_of(
    obj({"name": TEXT, "bytes": required(_BYTES)}, nullable=False, needs=("name", "bytes")), nullable=False
)
_BY_CATEGORY = dict_of(required(_BYTES), nullable=False)
# Containers the renderers read with ``.get(key, {})`` / ``.get(key, [])`` are refused as null (the default
# only replaces an absent key); those read with ``or {}`` or a truthiness test may be null.
_RUNG = obj(
    {
        "kind": TEXT,
        "action": required(TEXT),
        "fits": FLAG,
        "why": TEXT,
        "peak": _BYTES,
        "saves": _BYTES,
        "config": obj({"microbatches": COUNT}, nullable=False),
    },
    nullable=False,
    needs=("action",),
)
_MEMORY_FIELDS: dict[str, Check] = {
    "error": TEXT,
    "compiled": TEXT,
    "peak": obj(
        {
            "total": _BYTES,
            "breakdown_total": _BYTES,
            "step": COUNT,
            "by_category": _BY_CATEGORY,
            "modules": _NAMED_BYTES,
            "blocks": _NAMED_BYTES,
            "sites": _NAMED_BYTES,
        },
        nullable=False,
    ),
    "before_training": obj({"total": required(_BYTES), "site": TEXT, "op": TEXT}, needs=("total",)),
    "evaluation": obj({"note": TEXT}),
    "samples": rows({"by_category": _BY_CATEGORY}, needs=("by_category",)),
    "cuda": obj(
        {key: required(_BYTES) for key in ("reserved", "reserved_free", "share", "largest_free")},
        needs=("reserved", "reserved_free", "share", "largest_free"),
    ),
    "growth": obj(
        {
            "per_step": NUMBER,
            "steps_left": COUNT,
            "capacity": _BYTES,
            "stopped": obj(
                {key: required(_BYTES) for key in ("grew", "live", "flat_steps")},
                needs=("grew", "live", "flat_steps"),
            ),
            "bounded": obj(
                {
                    "optimizer": TEXT,
                    **{
                        key: required(_BYTES)
                        for key in ("grew_per_step", "pairs", "history_size", "cap", "left")
                    },
                },
                needs=("grew_per_step", "optimizer", "pairs", "history_size", "cap", "left"),
            ),
            "kept": obj({"activations": required(_BYTES)}, needs=("activations",)),
            "sites": list_of(
                obj(
                    {"site": required(TEXT), "per_step": required(NUMBER), "live": _BYTES},
                    nullable=False,
                    needs=("site", "per_step"),
                ),
                nullable=False,
            ),
        }
    ),
    "top_cause": obj({"key": TEXT, "text": TEXT, "note": TEXT}),
    "oom": obj(
        {
            "limit": _BYTES,
            "live": _BYTES,
            "kept_activations": _BYTES,
            "plan_error": TEXT,
            "by_category": _BY_CATEGORY,
            "request": obj(
                {
                    "bytes": _BYTES,
                    "step": COUNT,
                    "phase": TEXT,
                    "op": TEXT,
                    "site": TEXT,
                    "module": TEXT,
                    "device_error": TEXT,
                },
                nullable=False,
            ),
            "plan": obj({"batch": COUNT}),
            "ladder": list_of(_RUNG, nullable=False),
        },
        needs=("request",),
    ),
}


def _count(value: Any) -> int | None:
    """``value`` as a byte or step count (an integer >= 0, not a bool), else None: a view made in-process from an
    unchecked dict may hold anything, and a verdict never guesses."""
    return value if is_int(value) and value >= 0 else None


def _part(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(kw_only=True, slots=True)
class MemorySection(StageSection):
    """``sections["memory"]`` (:func:`torchscalpel.memory.analysis.build_section`; a section whose analysis failed
    keeps what was measured and its ``error``). The parts are trees the memory stage, its renderers and ``scalpel
    fix`` share; the verdict and the next step are said here once (:attr:`verdict`, :meth:`next_step`) for the
    terminal and the page alike."""

    KEY: ClassVar[str] = "memory"
    CHECKS: ClassVar[Mapping[str, Check]] = {
        **_MEMORY_FIELDS,
        "limit": _BYTES,
        "capacity": _BYTES,
        "device": TEXT,
    }

    version: Any = None
    device: str | None = None
    """The device type the run measured (``cpu``, ``cuda``)."""
    limit: int | None = None
    """The ``--memory-limit`` in bytes; None: no limit was set."""
    capacity: int | None = None
    """What growth is projected against: the limit, else the device's (or host's) memory; None when unknown."""
    error: str | None = None
    """Why the analysis failed (what was measured is kept beside it); None when it did not."""
    compiled: str | None = None
    peak: dict[str, Any] | None = None
    """``total``, ``breakdown_total``, ``step``, ``phase``, ``op``, ``module``, ``by_category``, ``modules``,
    ``blocks``, ``sites`` at the peak of live tensors."""
    before_training: dict[str, Any] | None = None
    evaluation: dict[str, Any] | None = None
    samples: list[dict[str, Any]] | None = None
    """Live bytes by category at each step end."""
    cuda: dict[str, Any] | None = None
    growth: dict[str, Any] | None = None
    """``per_step`` (bytes a step, when memory grows), ``steps_left``, ``capacity``, ``steps``, ``note``,
    ``stopped``, ``bounded``, ``kept``, ``sites``."""
    top_cause: dict[str, Any] | None = None
    oom: dict[str, Any] | None = None
    """The post-mortem of a run that ran out: ``request``, ``live``, ``limit``, ``by_category``, ``ladder``."""

    @classmethod
    def problem(cls, data: Any, where: str) -> str | None:
        """The typed checks, and an analysed out-of-memory must name its cause (a section whose analysis failed
        has no cause to name)."""
        problem = super(MemorySection, cls).problem(data, where)
        if problem is None and data.get("oom") and not data.get("error"):
            top = data.get("top_cause")
            if not isinstance(top, dict) or not isinstance(top.get("text"), str):
                return must(
                    f"{where}.top_cause", "an object with a text (an out-of-memory names its cause)", top
                )
        return problem

    @property
    def growth_per_step(self) -> int | None:
        """Bytes memory grows per step; None (or 0) when it does not grow."""
        return _count(_part(self.growth).get("per_step"))

    @property
    def capacity_words(self) -> str:
        """What the headroom is measured against: the --memory-limit, the GPU, or (a CPU run) host RAM."""
        if self.limit:
            return "the --memory-limit"
        return "host RAM, a CPU run" if self.device == "cpu" else "the device's memory"

    @property
    def verdict(self) -> str | None:
        """One sentence answering "is memory a problem?" for a run that did not run out: growth with its rate,
        or stable with the peak and the headroom left; None for a run that ran out (its headline says so). A
        section whose analysis failed is not judged: growth was never computed, so "stable" would be a guess."""
        if self.error:
            return f"verdict: not judged: {self.error}; what was measured follows"
        if self.oom or not isinstance(self.peak, dict):
            return None
        peak = _count(self.peak.get("total")) or 0
        capacity = _count(self.limit) or _count(self.capacity)
        room = ""
        if capacity:
            room = f", headroom {fmt_bytes(max(0, capacity - peak))} of {fmt_bytes(capacity)} ({self.capacity_words})"
        growth = _part(self.growth)
        rate = self.growth_per_step
        if rate:
            left = _count(growth.get("steps_left"))
            cap = _count(growth.get("capacity"))
            until = (
                (
                    f", {left} more steps until {fmt_bytes(cap)}"
                    if left
                    else f", it reached {fmt_bytes(cap)} in this run"
                )
                if left is not None and cap
                else ""
            )
            return f"verdict: memory grows {fmt_bytes(rate)} per step{until}: a leak to fix"
        if isinstance(growth.get("note"), str):
            return f"verdict: peak {fmt_bytes(peak)}{room}; growth not judged ({growth['note']})"
        steps = _count(growth.get("steps"))
        over = f" over {steps} step ends" if steps else ""
        return f"verdict: stable, no growth{over}; peak {fmt_bytes(peak)}{room}"

    def next_step(self, script: str, run_dir: str) -> str:
        """What to run after this memory run: the patch for a run that ran out, the leak's lines for one that
        grows, tune for a stable one (``--fit SIZE`` where a smaller device must hold it)."""
        if self.oom:
            return (
                f"next: scalpel fix {run_dir} --verify (the ladder's first rung that fits, as a patch of your "
                "script, or why it cannot be one)"
            )
        if self.growth_per_step:
            return (
                "next: fix the growing line(s) above (keep loss.item(), not loss; del outputs kept from an earlier "
                f"step), then scalpel memory -- {script} again"
            )
        return (
            f"next: scalpel tune -- {script} (speed); scalpel tune --fit SIZE -- {script} keeps only what fits "
            "in SIZE"
        )


def _location(value: Any, where: str) -> str | None:
    """A finding's ``location`` (:class:`torchscalpel.findings.Location`: file, line, column and nothing else,
    since readers rebuild it with ``Location(**location)``)."""
    problem = obj({"file": required(TEXT), "line": required(COUNT), "column": COUNT}, needs=("file", "line"))(
        value, where
    )
    if problem is None and value is not None:
        extra = sorted(set(value) - {"file", "line", "column"})
        if extra:
            return must(f"{where}", "an object of file, line and column", f"... {extra[0]!s} ...")
    return problem


FINDING = obj(
    {
        "rule": required(TEXT),
        "severity": required(TEXT),  # drawn as text; an unknown one is shown, not parsed
        "message": required(TEXT),
        "evidence": list_of(required(TEXT), nullable=False),
        "fix": required(TEXT),
        "location": _location,
        "source": TEXT,
        "rank": COUNT,
    },
    nullable=False,
    needs=("rule",),  # a hand-made finding may leave out the rest; the readers .get it
)
"""One of ``record.findings`` (:meth:`torchscalpel.findings.Finding.to_dict`; readers rebuild it with
``Finding.from_dict``)."""

ENVIRONMENT = obj(
    {"cpu": obj({"load_avg_1m": AMOUNT, "usable_cores": COUNT}), "cpu_count": COUNT},
    nullable=False,
)
"""What the renderers compute from ``record.environment`` (the busy-machine note: load over cores); the rest of
the facts are shown as text."""
PROVENANCE = obj(
    {
        "git": obj({}),
        "code": obj({"script": obj({}), "modules": dict_of(obj({}))}),
        "data": obj({}),
        "seeds": obj(
            {
                "calls": list_of(obj({}, nullable=False)),
                "loaders": list_of(obj({}, nullable=False)),
            }
        ),
    },
    nullable=False,
)
"""``record.provenance`` as ``compare`` reads it: objects where it calls ``.get`` (their values it only compares).
``scalpel fix`` checks the paths and digests it uses itself (:mod:`torchscalpel.fix.record_values`)."""

PART_CHECKS: dict[str, Check] = {
    "findings": list_of(FINDING, nullable=False),
    "environment": ENVIRONMENT,
    "provenance": PROVENANCE,
    "summary": lambda v, where: RunSummary.problem(v, where),
    "profiler": lambda v, where: ProfilerSection.problem(v, where),
    "config": lambda v, where: RunConfig.problem(v, where),
}
"""The record's typed top-level parts (a view each)."""
SECTION_CHECKS: dict[str, Check] = {
    **{
        cls.KEY: cls.problem
        for cls in (
            TraceSection,
            TuneSection,
            PlanSection,
            DoctorSection,
            LrSection,
            BatchSection,
            SitesSection,
            EvalSection,
            MemorySection,
        )
    },
}
"""``record.sections[KEY]``: each stage section a renderer or ``scalpel fix`` reads."""


def check_section(key: str, value: Any) -> str | None:
    """``sections[key]`` checked (:data:`SECTION_CHECKS`; a section no reader types passes)."""
    check = SECTION_CHECKS.get(key)
    return None if check is None else check(value, f"sections.{key}")


def check_parts(data: Mapping[str, Any]) -> str | None:
    """The first value of a decoded ``run.json`` that a renderer or ``scalpel fix`` would read and that does not
    fit its declared type and range (summary, profiler, config and every stage section), as one clause naming
    it (``sections.batch.rows[2].samples_per_s must be a finite number >= 0, not 'x'``); None when all fit.
    Absent parts and fields pass (an older torchscalpel did not write them); only present-but-wrong values are
    refused. :func:`torchscalpel.record.load_record` runs it after the schema check."""
    for key, check in PART_CHECKS.items():
        if key in data:
            problem = check(data[key], key)
            if problem is not None:
                return problem
    for key, value in (data.get("sections") or {}).items():
        problem = check_section(key, value)
        if problem is not None:
            return problem
    return None

"""Typed views of the Run record's dict parts: ``summary``, ``profiler``, ``config`` and the stage
sections (``sections["trace"]``, ``["tune"]``, ``["plan"]``, ``["doctor"]``), one definition each.

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

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

V = TypeVar("V", bound="SectionView")

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


def _defaults(cls: type[SectionView]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


@dataclass(kw_only=True, slots=True)
class RunSummary(SectionView):
    """``record.summary``: medians and shares over the measured, unprofiled steps (written by
    :func:`torchscalpel.runtime.summary.summarize`). None: the run had nothing to compute it from."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"steps_total", "steps_measured", "steps_summarized"})

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
    """``flops_per_step`` over the median step time."""
    mfu: dict[str, Any] | None = None
    """``gpu``, ``peak_tflops_bf16``, ``mfu`` (fraction) when the device's peak is known."""
    recompute_flops_per_step: float | None = None
    """FLOPs of forwards recomputed inside backward (activation checkpointing), apart from the model's."""
    flops_not_measured: str | None = None
    """Why ``flops_per_step`` is missing when the run had a FLOP-counting window."""
    phase_median_ms: dict[str, float] | None = None
    """Median time per phase over the same steps as ``median_step_ms`` (need not sum to it)."""
    phase_median_share: dict[str, float] | None = None
    """Each phase's median over the median step: the share shown beside ``phase_median_ms``."""


@dataclass(kw_only=True, slots=True)
class ProfilerSection(SectionView):
    """``record.profiler``: the torch.profiler window (its op summary is ``sections["trace"]``;
    schema 1.0 copies of ``top_ops``/``categories``/``memory`` stay in ``extra``)."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"steps", "trace"})

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
class SitesSection(StageSection):
    """``sections["sites"]``: where the run built its optimizers, DataLoaders and model and called forward
    and backward (:class:`torchscalpel.runtime.sites.SitesObserver`); what ``scalpel fix`` edits.
    A site is ``{"file", "line", "class", "library", "used"}`` (see the observer's doc)."""

    KEY: ClassVar[str] = "sites"
    ALWAYS: ClassVar[frozenset[str]] = frozenset({"optimizers", "dataloaders"})

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

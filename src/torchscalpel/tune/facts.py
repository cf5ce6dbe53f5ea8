"""Facts about a script's model, data and hardware that decide which knobs can apply.

The baseline trial collects them with :class:`FactsObserver` (from the live objects the runtime
saw) and stores them in ``record.sections["tune_facts"]``; the search reads them back to pick
candidates, and to skip a knob with the reason when it cannot apply.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from torchscalpel.blocks import calls_from_rows, find_blocks
from torchscalpel.runtime.observer import Observer

if TYPE_CHECKING:
    from torchscalpel.record import RunRecord
    from torchscalpel.runtime.session import Session

MAX_ATTENTION_SITES = 8
"""Distinct ``F.scaled_dot_product_attention`` call sites kept (a model has one or two attention classes)."""
ATTENTION_CALLS_WALKED = 256
"""The calls whose stack is read for their site: a model's layers all call in its first forward."""


@dataclass(kw_only=True, slots=True)
class ModelFacts:
    """What the baseline saw. Defaults describe "nothing seen" so missing facts skip knobs safely."""

    device: str = "cpu"
    """Device type of the model's parameters (``cpu`` or ``cuda``)."""
    bf16_supported: bool = False
    """bf16 is fast on this device (CPU: avx512_bf16/AMX via oneDNN; CUDA: compute capability >= 8)."""
    models: list[str] = field(default_factory=list)
    """Class names of the root modules seen."""
    submodules: list[dict[str, Any]] = field(default_factory=list)
    """Top-level children of the model: ``name``, ``cls``, ``params`` (count), ``forward_ms`` when timed."""
    repeated: list[dict[str, Any]] = field(default_factory=list)
    """The repeated block classes (:mod:`torchscalpel.blocks`, the definition plan and dist use),
    called in the baseline's forward: ``cls``, ``count``, ``params``."""
    uncalled_blocks: list[str] = field(default_factory=list)
    """Block classes the module structure names that the baseline's forward never called."""
    forward_ms: float | None = None
    """The whole model's forward time over the measured steps (same units as ``submodules``)."""
    has_conv: bool = False
    """The model holds a 2-D convolution (channels_last candidate)."""
    loaders: int = 0
    """DataLoaders iterated."""
    loader_workers: int = 0
    """num_workers of the first DataLoader (0 when none)."""
    iterable_dataset: bool = False
    """The first DataLoader wraps an IterableDataset (extra workers would duplicate its data)."""
    optimizers: list[str] = field(default_factory=list)
    """Optimizer class names."""
    optimizer_impl: str | None = None
    """``foreach`` / ``fused`` when the script already chose one."""
    input_shapes_vary: bool = False
    """The model's first input changed shape between calls (dynamic-shape compile candidate)."""
    cpu_count: int = 1
    """CPUs this process may use."""
    torch_threads: int = 1
    """``torch.get_num_threads()`` during the baseline."""
    bf16_detail: str = ""
    """How bf16 runs here: ``amx_bf16`` / ``avx512_bf16`` (native on CPU), ``emulated`` (converted
    to float32 per op: slower than float32), ``sm80+`` / ``absent`` on CUDA."""
    attention_calls: int | None = None
    """``F.scaled_dot_product_attention`` calls seen in the baseline (None: not counted, an
    older record); 0 means the fp32-attention variant of amp has nothing to change."""
    attention_sites: list[dict[str, Any]] = field(default_factory=list)
    """Where those calls came from (the first few distinct ones): the user's ``file:line`` of the call, or
    of the user's line that led there with ``library`` naming the package that made it (``transformers``):
    where ``scalpel fix`` places amp's fp32 attention."""
    cache_in_training: bool = False
    """The model is a transformers model in training whose config asks for a key/value cache
    (``use_cache`` True, its default): the compile candidates turn it off (``compile.use_cache``)."""
    batches_per_epoch: int | None = None
    """``len()`` of the first DataLoader (None: not sized, or no DataLoader): with the script's
    ``--epochs`` it gives the run's length for the pays-back arithmetic."""
    cpu_isa: str = ""
    """The widest matrix ISA of this CPU that inductor's C++ GEMM templates use (:func:`gemm_isa`): ``amx``,
    ``avx512``, ``avx2``, or empty (not known, not x86). Decides whether ``max-autotune-no-cudagraphs`` is a
    compile candidate on a GEMM-bound CPU step."""
    bottleneck: dict[str, Any] = field(default_factory=dict)
    """The baseline's bottleneck class (:class:`~torchscalpel.tune.bottleneck.Bottleneck` as a dict);
    set by the search from the profiled facts run, read by knobs that tailor their candidates."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ModelFacts:
        """Read back, ignoring unknown keys."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""CPU flags with native bf16 dot products (oneDNN uses them for bf16 matmul and conv)."""


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none: macOS, Windows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def gemm_isa(flags: set[str], capability: str | None = None) -> str:
    """``amx`` / ``avx512`` / ``avx2`` / ``""``: the widest ISA the CPU's flags (``/proc/cpuinfo``, the same flags
    :mod:`torchscalpel.envcheck` reports) give inductor's C++ GEMM micro-kernels.

    ``capability`` is torch's own view (``torch.backends.cpu.get_cpu_capability()``): a hypervisor may list
    AVX-512 or AMX flags that torch does not use, and then torch's narrower view wins."""
    if {"amx_tile", "amx_bf16"} <= flags:
        isa = "amx"
    elif "avx512f" in flags:
        isa = "avx512"
    elif "avx2" in flags:
        isa = "avx2"
    else:
        return ""
    if capability in ("AVX2", "DEFAULT", "NO AVX") and isa in ("amx", "avx512"):
        return "avx2" if capability == "AVX2" else ""
    return isa


def torch_cpu_capability() -> str | None:
    """``torch.backends.cpu.get_cpu_capability()`` (None on a torch without it)."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return None


def bf16_support(device: str, flags: set[str] | None = None) -> tuple[bool, str]:
    """(fast, detail): whether bf16 arithmetic is native on ``device`` and how it runs.

    On CPU oneDNN reports bf16 "supported" on any AVX-512 core, but without ``avx512_bf16`` or
    AMX each bf16 op is converted to float32 and back: slower than float32, so not fast.
    """
    if device == "cuda":
        if not torch.cuda.is_available():
            return False, "absent"
        ok = (
            bool(torch.cuda.is_bf16_supported(including_emulation=False))
            if _has_emulation_arg()
            else bool(torch.cuda.is_bf16_supported())
        )
        return ok, "sm80+" if ok else "absent"
    flags = cpu_flags() if flags is None else flags
    native = next((f for f in NATIVE_BF16_FLAGS if f in flags), None)
    if native:
        return True, native
    try:
        mkldnn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        mkldnn = False
    if mkldnn and not flags:  # no flags to read (not Linux): trust oneDNN
        return True, "onednn"
    return False, "emulated" if mkldnn else "absent"


def _has_emulation_arg() -> bool:
    import inspect

    try:
        return "including_emulation" in inspect.signature(torch.cuda.is_bf16_supported).parameters
    except (TypeError, ValueError):
        return False


def bf16_supported(device: str) -> bool:
    """True when bf16 arithmetic is fast on ``device`` (not emulated)."""
    return bf16_support(device)[0]


def cpu_count() -> int:
    """CPUs available to this process (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def describe_model(
    model: torch.nn.Module, module_ms: dict[str, float] | None = None, calls: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Submodules and repeated block classes of ``model`` (the compile-region candidates).

    ``calls``: forward calls per submodule name seen in the run (``record.modules``); a block
    class the forward never called is listed in ``uncalled_blocks`` instead of ``repeated``.
    """
    module_ms = module_ms or {}
    children = []
    for name, child in model.named_children():
        params = sum(p.numel() for p in child.parameters())
        if params:
            children.append(
                {
                    "name": name,
                    "cls": type(child).__name__,
                    "params": params,
                    "forward_ms": module_ms.get(name),
                }
            )
    found = find_blocks(model, calls)
    repeated: dict[str, dict[str, Any]] = {}
    for _, block in found:
        entry = repeated.setdefault(
            type(block).__name__, {"cls": type(block).__name__, "count": 0, "params": 0}
        )
        entry["count"] += 1
        entry["params"] += sum(p.numel() for p in block.parameters())
    ranked = sorted(repeated.values(), key=lambda r: -r["params"])
    static = [] if calls is None else [type(b).__name__ for _, b in find_blocks(model)]
    uncalled = sorted({c for c in static if c not in repeated})
    has_conv = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    return {"submodules": children, "repeated": ranked, "uncalled_blocks": uncalled, "has_conv": has_conv}


class FactsObserver(Observer):
    """Collects :class:`ModelFacts` during the baseline run into ``record.sections["tune_facts"]``."""

    name = "tune-facts"

    def __init__(self) -> None:
        self._session: Session | None = None
        self._first_shape: dict[int, tuple[int, ...]] = {}
        """First input shape per root model (by id): a loss module called on the logits is a root
        too, and its input is not the model's, so shapes are compared per module."""
        self._shapes_vary = False
        self._loader: Any = None
        # Strong references: the session holds weak ones, and the script's objects are gone by
        # on_finish (the runtime stops the script by raising inside it).
        self._roots: list[torch.nn.Module] = []
        self._optimizers: list[Any] = []

    def on_start(self, session: Session) -> None:
        self._session = session
        self._count_attention()

    def _count_attention(self) -> None:
        """Count ``F.scaled_dot_product_attention`` calls (what amp's fp32-attention variant patches)."""
        import torch.nn.functional as F

        original = F.scaled_dot_product_attention
        self._attention_original = original
        self._attention_calls = 0
        self._attention_sites: list[dict[str, Any]] = []

        def counted(*args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling():
                self._attention_calls += 1
                # the first calls show every site (the model's layers in its first forward); a stack walk
                # per call after them would only slow the facts run
                if (
                    self._attention_calls <= ATTENTION_CALLS_WALKED
                    and len(self._attention_sites) < MAX_ATTENTION_SITES
                ):
                    self._note_attention_site(sys._getframe(1))
            return original(*args, **kwargs)

        F.scaled_dot_product_attention = counted

    def _note_attention_site(self, frame: Any) -> None:
        from torchscalpel.runtime.sites import caller_site

        site = caller_site(None, frame)
        if site is not None and site not in self._attention_sites:
            self._attention_sites.append(site)

    def on_forward_pre(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], root: bool
    ) -> None:
        if not root:
            return
        if all(m is not module for m in self._roots):
            self._roots.append(module)
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is None:
            return
        shape = tuple(first.shape)
        if next(iter(module.parameters()), None) is None:  # a loss module: not a compile region
            return
        if shape != self._first_shape.setdefault(id(module), shape):
            self._shapes_vary = True

    def on_optimizer_step_pre(self, optimizer: torch.optim.Optimizer) -> None:
        if all(o is not optimizer for o in self._optimizers):
            self._optimizers.append(optimizer)

    def on_batch(self, batch: Any, loader: Any) -> None:
        if self._loader is None and loader is not None:
            self._loader = loader

    def on_finish(self, record: RunRecord) -> None:
        original = getattr(self, "_attention_original", None)
        if original is not None:
            import torch.nn.functional as F

            F.scaled_dot_product_attention = original
        facts = self.collect(record)
        facts.attention_calls = getattr(self, "_attention_calls", None)
        facts.attention_sites = list(getattr(self, "_attention_sites", []))
        record.sections["tune_facts"] = facts.to_dict()

    def collect(self, record: RunRecord) -> ModelFacts:
        """Facts from the session's live objects and the record's module timings."""
        session = self._session
        roots = self._roots or list(getattr(session, "root_modules", []) or [])
        loaders = list(getattr(session, "loaders", []) or [])
        optimizers = self._optimizers or list(getattr(session, "optimizers", []) or [])
        if self._loader is not None and self._loader not in loaders:
            loaders.insert(0, self._loader)
        facts = ModelFacts(
            cpu_count=cpu_count(), torch_threads=torch.get_num_threads(), input_shapes_vary=self._shapes_vary
        )
        model = max(roots, key=lambda m: sum(p.numel() for p in m.parameters()), default=None)
        if model is not None:
            param = next(iter(model.parameters()), None)
            facts.device = param.device.type if param is not None else "cpu"
            facts.models = [type(m).__name__ for m in roots]
            module_ms = _module_ms(record)
            described = describe_model(model, module_ms, calls_from_rows(record.modules))
            facts.submodules = described["submodules"]
            facts.repeated = described["repeated"]
            facts.uncalled_blocks = described["uncalled_blocks"]
            facts.has_conv = described["has_conv"]
            facts.forward_ms = module_ms.get("<root>")
            from torchscalpel.tune.knobs.compile import builds_cache_in_training

            facts.cache_in_training = any(builds_cache_in_training(m) for m in roots)
        facts.bf16_supported, facts.bf16_detail = bf16_support(facts.device)
        facts.cpu_isa = gemm_isa(cpu_flags(), torch_cpu_capability())
        facts.loaders = len(loaders)
        if loaders:
            facts.loader_workers = int(getattr(loaders[0], "num_workers", 0) or 0)
            dataset = getattr(loaders[0], "dataset", None)
            facts.iterable_dataset = isinstance(dataset, torch.utils.data.IterableDataset)
            try:
                facts.batches_per_epoch = len(loaders[0])
            except TypeError:  # an IterableDataset without __len__: the run's length is not known
                facts.batches_per_epoch = None
        facts.optimizers = [type(o).__name__ for o in optimizers]
        for opt in optimizers:
            for group in getattr(opt, "param_groups", []):
                if group.get("fused"):
                    facts.optimizer_impl = "fused"
                elif group.get("foreach") and facts.optimizer_impl is None:
                    facts.optimizer_impl = "foreach"
        return facts


def _module_ms(record: RunRecord) -> dict[str, float]:
    """Per-submodule forward time over the measured steps (ms), keyed by name under the root module."""
    out: dict[str, float] = {}
    for entry in record.modules or []:
        name, ms = entry.get("name"), entry.get("forward_ms")
        if isinstance(name, str) and isinstance(ms, int | float):
            out[name] = float(ms)
    return out

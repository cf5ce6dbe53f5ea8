"""How a script shards its model with FSDP: FSDP1 (``FullyShardedDataParallel(model, ...)``, as the tutorials write
it) or FSDP2 (``fully_shard(module, ...)``), read as one :class:`FsdpWrap` three ways:

- from a live FSDP1 wrapper (:func:`from_module`: ``torchscalpel.distributed.wrap`` refuses to wrap it twice and
  says how it maps to ``fully_shard``);
- from the call itself while a planning run goes through the script (:class:`FsdpCapture`: the wrap is recorded
  and the module handed back unwrapped, so the script trains its first step on one rank on any machine; FSDP1
  itself refuses to run without an accelerator, and neither's sharded parameters can be copied for the plan);
- from an FSDP1 script's source (:func:`read_source`), where running it would need a process group.

A wrap is its sharding (FSDP1's ``ShardingStrategy``; FSDP2's ``reshard_after_forward``), the parameter dtype of
its mixed precision, whether it offloads to the CPU and what it leaves unsharded, with the plan strategy it
stands for.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

SHARDING_TO_PLAN = {
    "FULL_SHARD": "fsdp-full",
    "SHARD_GRAD_OP": "fsdp-grad-op",
    "NO_SHARD": "ddp",
    "HYBRID_SHARD": "fsdp-hybrid",
    "_HYBRID_SHARD_ZERO2": "fsdp-hybrid",
}
"""FSDP1's ``ShardingStrategy`` -> the plan strategy with the same per-rank states: NO_SHARD keeps a full copy of
parameters, gradients and optimizer state on every rank and all-reduces the gradients, as DDP does."""
LOW_PRECISION = {
    "bfloat16": "bf16-mixed",
    "bf16": "bf16-mixed",
    "float16": "fp16-mixed",
    "half": "fp16-mixed",
}
"""``MixedPrecision(param_dtype=...)`` -> the plan precision: fp32 sharded parameters, computation (and the
gathered copies) in the low dtype."""
CLASS_NAME = "FullyShardedDataParallel"
FSDP2 = "fully_shard"


@dataclass(frozen=True, slots=True)
class FsdpWrap:
    """One ``FullyShardedDataParallel(...)`` or ``fully_shard(...)`` call: what it asks for and where it is."""

    api: str = CLASS_NAME
    """``FullyShardedDataParallel`` (FSDP1) or ``fully_shard`` (FSDP2)."""
    sharding: str = "FULL_SHARD"
    """``ShardingStrategy`` member name (FSDP1's default: FULL_SHARD); FSDP2's ``reshard_after_forward=False``
    is SHARD_GRAD_OP, and a 2-D mesh HYBRID_SHARD."""
    param_dtype: str | None = None
    """``MixedPrecision(param_dtype=...)``'s dtype name (``bfloat16``), None without mixed precision."""
    cpu_offload: bool = False
    """``CPUOffload(offload_params=True)``: sharded parameters and gradients (and so the optimizer step and its
    state) live in host memory."""
    ignored_modules: tuple[str, ...] = ()
    """``ignored_modules`` (FSDP2: ``ignored_params``' modules): names (live) or the source text (static); their
    parameters are not sharded."""
    ignored_bytes: int = 0
    """Parameter bytes of the ignored modules (known from a live call only; 0 from the source)."""
    site: str = ""
    """``file:line`` of the call."""

    @property
    def strategy(self) -> str:
        """The plan strategy this wrap stands for (``fsdp-full`` for FULL_SHARD)."""
        return SHARDING_TO_PLAN.get(self.sharding, "fsdp-full")

    @property
    def precision(self) -> str | None:
        """The plan precision ``param_dtype`` stands for (None: as the script ran)."""
        return LOW_PRECISION.get(self.param_dtype or "")

    def describe(self) -> str:
        """``FullyShardedDataParallel(FULL_SHARD, param_dtype bfloat16, CPU offload, 1 ignored module)``."""
        parts = [self.sharding]
        if self.param_dtype:
            parts.append(f"param_dtype {self.param_dtype}")
        if self.cpu_offload:
            parts.append("CPU offload")
        if self.ignored_modules:
            n = len(self.ignored_modules)
            parts.append(f"{n} ignored module{'s' if n != 1 else ''}")
        return f"{self.api}({', '.join(parts)})"

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the plan section's ``fsdp``)."""
        return {
            "api": self.api,
            "sharding": self.sharding,
            "param_dtype": self.param_dtype,
            "cpu_offload": self.cpu_offload,
            "ignored_modules": list(self.ignored_modules),
            "ignored_bytes": self.ignored_bytes,
            "site": self.site,
            "strategy": self.strategy,
        }


def _dtype_name(value: Any) -> str | None:
    return None if value is None else str(value).removeprefix("torch.")


def _enum_name(value: Any, default: str) -> str:
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else default


def _param_bytes(params: Any) -> int:
    seen: set[int] = set()
    total = 0
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def from_call(module: Any, kwargs: dict[str, Any], *, site: str = "") -> FsdpWrap:
    """The wrap ``FullyShardedDataParallel(module, **kwargs)`` asks for (the live objects it was given)."""
    mixed = kwargs.get("mixed_precision")
    offload = kwargs.get("cpu_offload")
    ignored = list(kwargs.get("ignored_modules") or ())
    named = module.named_modules() if hasattr(module, "named_modules") else ()
    names = {id(m): n or "(the model)" for n, m in named}
    return FsdpWrap(
        sharding=_enum_name(kwargs.get("sharding_strategy"), "FULL_SHARD"),
        param_dtype=_dtype_name(getattr(mixed, "param_dtype", None)),
        cpu_offload=bool(getattr(offload, "offload_params", False)),
        ignored_modules=tuple(names.get(id(m), type(m).__name__) for m in ignored),
        ignored_bytes=_param_bytes(p for m in ignored for p in m.parameters()),
        site=site,
    )


def from_fully_shard(module: Any, kwargs: dict[str, Any], *, site: str = "") -> FsdpWrap:
    """The wrap ``fully_shard(module, **kwargs)`` asks for: ``reshard_after_forward=False`` keeps the gathered
    parameters to the backward (SHARD_GRAD_OP), a 2-D mesh shards within and replicates across (HYBRID_SHARD)."""
    mesh = kwargs.get("mesh")
    hybrid = getattr(mesh, "ndim", 1) == 2
    reshard = kwargs.get("reshard_after_forward", True)
    offload = kwargs.get("offload_policy")
    ignored = list(kwargs.get("ignored_params") or ())
    return FsdpWrap(
        api=FSDP2,
        sharding="HYBRID_SHARD" if hybrid else "SHARD_GRAD_OP" if reshard is False else "FULL_SHARD",
        param_dtype=_dtype_name(getattr(kwargs.get("mp_policy"), "param_dtype", None)),
        cpu_offload=type(offload).__name__ == "CPUOffloadPolicy",
        ignored_modules=(f"{len(ignored)} parameters",) if ignored else (),
        ignored_bytes=_param_bytes(ignored),
        site=site,
    )


def fsdp1_class() -> type | None:
    """``torch.distributed.fsdp.FullyShardedDataParallel`` (None where torch has no distributed package)."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except Exception:  # a torch built without distributed: nothing to recognise
        return None
    return FullyShardedDataParallel


def from_module(model: Any) -> FsdpWrap | None:
    """The outermost FSDP1 wrapper in ``model`` (the model itself or a submodule), read from its attributes."""
    cls = fsdp1_class()
    if cls is None or not hasattr(model, "modules"):
        return None
    wrapper = next((m for m in model.modules() if isinstance(m, cls)), None)
    if wrapper is None:
        return None
    inner = getattr(wrapper, "_fsdp_wrapped_module", None) or getattr(wrapper, "module", wrapper)
    ignored = list(getattr(wrapper, "_ignored_modules", ()) or ())
    return from_call(
        inner,
        {
            "sharding_strategy": getattr(wrapper, "sharding_strategy", None),
            "mixed_precision": getattr(wrapper, "mixed_precision", None),
            "cpu_offload": getattr(wrapper, "cpu_offload", None),
            "ignored_modules": ignored,
        },
    )


@dataclass(slots=True)
class FsdpCapture:
    """While a planning run goes through the script, ``FullyShardedDataParallel(module, ...)`` and
    ``fully_shard(module, ...)`` record what they asked for and return ``module`` itself: the plan needs the
    model's shapes on one rank, not FSDP's sharded parameters (which cannot be copied for it), and FSDP1 refuses
    a CPU-only machine. An FSDP1 wrapper's ``clip_grad_norm_`` is kept on the returned module (as the plain
    clipping of its parameters), so a tutorial script runs its first step."""

    wraps: list[FsdpWrap] = field(default_factory=list)

    def setup_hook(self) -> Callable[[], None] | None:
        """A runtime setup hook: install the capture; returns the undo (None where FSDP is not available)."""
        undo: list[Callable[[], None]] = []
        cls = fsdp1_class()
        if cls is not None:
            undo.append(self._capture_fsdp1(cls))
        undo.extend(self._capture_fully_shard())
        if not undo:
            return None

        def undo_all() -> None:
            for step in reversed(undo):
                step()

        return undo_all

    def _capture_fsdp1(self, cls: type) -> Callable[[], None]:
        had = "__new__" in cls.__dict__
        before = cls.__dict__.get("__new__")
        capture = self

        def new(klass: type, module: Any = None, *args: Any, **kwargs: Any) -> Any:
            if module is None:
                module = kwargs.pop("module", None)
            if module is None or args:  # positional options: not the tutorial form, leave it to FSDP1
                return object.__new__(klass)
            capture.wraps.append(from_call(module, kwargs, site=_user_site()))
            _keep_clipping(module)
            return module

        cls.__new__ = staticmethod(new)  # type: ignore[assignment]

        def undo() -> None:
            if had:
                cls.__new__ = before  # type: ignore[assignment]
            else:
                del cls.__new__

        return undo

    def _capture_fully_shard(self) -> list[Callable[[], None]]:
        try:
            import torch.distributed.fsdp as fsdp
        except Exception:  # a torch built without distributed
            return []
        original = getattr(fsdp, FSDP2, None)
        if original is None:
            return []
        capture = self

        def fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
            if args or not hasattr(
                module, "parameters"
            ):  # a list of modules, positional options: FSDP2's own
                return original(module, *args, **kwargs)
            capture.wraps.append(from_fully_shard(module, kwargs, site=_user_site()))
            return module

        undo: list[Callable[[], None]] = []
        for owner in _fully_shard_owners(original):
            setattr(owner, FSDP2, fully_shard)
            undo.append(functools.partial(setattr, owner, FSDP2, original))
        return undo


def _fully_shard_owners(original: Any) -> list[Any]:
    """The modules a script imports ``fully_shard`` from (the public one and the composable one it re-exports)."""
    owners = []
    for name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, FSDP2, None) is original:
            owners.append(module)
    return owners


def _user_site() -> str:
    """``file:line`` of the user's code that made the call (the frame walk skips torch and torchscalpel)."""
    from torchscalpel.runtime.userframes import user_site

    return user_site(sys._getframe(2))


def _keep_clipping(module: Any) -> None:
    """``model.clip_grad_norm_(max_norm)`` as FSDP1 offers it: on an unwrapped module, the plain clipping."""
    if hasattr(module, "clip_grad_norm_"):
        return
    import torch

    def clip_grad_norm_(max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm, norm_type)

    object.__setattr__(module, "clip_grad_norm_", clip_grad_norm_)


# -- the source ------------------------------------------------------------------------------------------------


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted name of what it was imported as (``FSDP`` -> ``torch.distributed.fsdp.Full...``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    return names


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str:
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value, aliases)}.{node.attr}"
    return ""


def _assigned(tree: ast.Module) -> dict[str, ast.AST]:
    """Name -> the value last assigned to it anywhere in the file (``bf16 = MixedPrecision(...)``)."""
    values: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    values[target.id] = node.value
    return values


def _resolve(node: ast.AST | None, assigned: dict[str, ast.AST]) -> ast.AST | None:
    for _ in range(4):  # a name bound to a name bound to the call
        if isinstance(node, ast.Name) and node.id in assigned:
            node = assigned[node.id]
        else:
            break
    return node


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _calls_named(tree: ast.Module, suffix: str, aliases: dict[str, str]) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _dotted(node.func, aliases).rsplit(".", 1)[-1] == suffix:
            yield node


def read_source(text: str, filename: str = "<script>") -> list[FsdpWrap]:
    """Every ``FullyShardedDataParallel(model, ...)`` call in ``text``, in source order (none for unparsable text).

    ``sharding_strategy=ShardingStrategy.X``, ``mixed_precision=MixedPrecision(param_dtype=torch.bf16)``,
    ``cpu_offload=CPUOffload(offload_params=True)`` and ``ignored_modules=...`` are read inline or through a name
    assigned in the file; what cannot be read statically keeps FSDP1's default."""
    try:
        tree = ast.parse(text, filename)
    except SyntaxError:
        return []
    aliases, assigned = _aliases(tree), _assigned(tree)
    found = []
    for call in sorted(_calls_named(tree, CLASS_NAME, aliases), key=lambda c: (c.lineno, c.col_offset)):
        if not (call.args or call.keywords):
            continue
        sharding = _resolve(_keyword(call, "sharding_strategy"), assigned)
        sharding_name = _dotted(sharding, aliases).rsplit(".", 1)[-1] if sharding is not None else ""
        mixed = _resolve(_keyword(call, "mixed_precision"), assigned)
        dtype = None
        if isinstance(mixed, ast.Call):
            param = _keyword(mixed, "param_dtype")
            dtype = _dotted(param, aliases).rsplit(".", 1)[-1] if param is not None else None
        offload = _resolve(_keyword(call, "cpu_offload"), assigned)
        offloaded = False
        if isinstance(offload, ast.Call):
            value = _keyword(offload, "offload_params") or (offload.args[0] if offload.args else None)
            offloaded = isinstance(value, ast.Constant) and value.value is True
        ignored = _keyword(call, "ignored_modules")
        found.append(
            FsdpWrap(
                sharding=sharding_name if sharding_name in SHARDING_TO_PLAN else "FULL_SHARD",
                param_dtype=dtype,
                cpu_offload=offloaded,
                ignored_modules=(ast.unparse(ignored),) if ignored is not None else (),
                site=f"{filename}:{call.lineno}",
            )
        )
    return found

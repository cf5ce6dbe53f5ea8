"""Shapes and runtimes: ``--dynamic`` (which dimensions are dynamic, with their bounds) and ``--opset``.

``--dynamic`` takes ``batch`` (the default: the first dimension of every input), ``none`` (every shape
fixed to the example), or a comma list naming dimensions by position, the same for every input:
``batch,seq`` makes dim 0 ``batch`` and dim 1 ``seq``; ``batch,_,h,w`` leaves dim 1 fixed;
``batch,seq:512`` bounds ``seq`` at 512. Inputs with fewer dimensions take the leading names only;
one name is one size across inputs (``input_ids`` and ``attention_mask`` share ``seq``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from torchscalpel.errors import UsageError

if TYPE_CHECKING:  # torch is imported when an export runs, not to parse --dynamic
    import torch

_SLOT = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_]{0,31})(?::(?P<max>[0-9]{1,7}))?$")
MIN_OPSET = 18
"""The oldest opset torch's dynamo ONNX exporter writes (asked for 17, it writes 18)."""


@dataclass(frozen=True, slots=True)
class Axis:
    """One named dynamic dimension: its position in every input and its upper bound (``None``: from the model)."""

    name: str
    dim: int
    max: int | None = None


def parse_dynamic(text: str) -> list[Axis]:
    """``--dynamic`` as a list of named axes (empty for ``none``); one sentence on a bad value."""
    text = (text or "").strip()
    if text == "none":
        return []
    if text == "batch":
        return [Axis("batch", 0)]
    slots = [s.strip() for s in text.split(",")]
    axes: list[Axis] = []
    for dim, slot in enumerate(slots):
        if slot in ("", "_"):
            continue
        m = _SLOT.match(slot)
        if m is None:
            raise UsageError(
                f"--dynamic {text!r}: {slot!r} is not a dimension name (letters, digits, _) with an optional :MAX; "
                "write e.g. 'batch,seq' or 'batch,seq:512'."
            )
        bound = int(m.group("max")) if m.group("max") else None
        if bound is not None and bound < 1:
            raise UsageError(f"--dynamic {text!r}: the bound of {m.group('name')!r} must be at least 1.")
        axes.append(Axis(m.group("name"), dim, bound))
    if not axes or axes[0].dim != 0 or axes[0].name != "batch":
        raise UsageError(
            f"--dynamic {text!r}: the first dimension must be 'batch' (what serve batches over); write e.g. 'batch,seq'."
        )
    if axes[0].max is not None:
        raise UsageError(f"--dynamic {text!r}: bound the batch with --max-batch, not batch:N.")
    names = [a.name for a in axes]
    if len(set(names)) != len(names):
        raise UsageError(f"--dynamic {text!r} names a dimension twice; give each position its own name.")
    return axes


def check_opset(opset: int) -> None:
    """Refuse (one sentence) an opset the exporter cannot write or the installed onnx/onnxruntime cannot read."""
    import onnx
    import onnxruntime

    top = min(onnx.defs.onnx_opset_version(), ort_max_opset())
    if not MIN_OPSET <= opset <= top:
        raise UsageError(
            f"--opset {opset} is not supported here: torch's ONNX exporter writes opset {MIN_OPSET} and newer, and "
            f"onnxruntime {onnxruntime.__version__} with onnx {onnx.__version__} runs up to opset {top}; choose "
            f"{MIN_OPSET} to {top}."
        )


def runtime_note(opset: int) -> str:
    """Which onnxruntime runs ``opset``, as far as this machine shows it (for the manifest and the log): the installed
    release, probed. Older releases are not named: which opset each implements is onnxruntime's own compatibility
    table, and a figure typed here unchecked would be a guess."""
    import onnxruntime

    return (
        f"runs on the installed onnxruntime {onnxruntime.__version__} (checked); for an older runtime see "
        "onnxruntime's compatibility table (docs/reference/compatibility)"
    )


@lru_cache(maxsize=1)
def ort_max_opset() -> int:
    """The newest default-domain opset the installed onnxruntime loads (probed with a one-node model)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def loads(opset: int) -> bool:
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = min(model.ir_version, 10)
        options = ort.SessionOptions()
        options.log_severity_level = 4
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:  # onnxruntime's Fail/InvalidGraph: this opset is newer than it implements
            return False
        return True

    lo, hi = MIN_OPSET, onnx.defs.onnx_opset_version()
    if not loads(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if loads(mid) else (lo, mid - 1)
    return lo


@dataclass(frozen=True, slots=True)
class AxisPlan:
    """A named axis resolved against the example inputs: its bound and the sizes parity checks it at."""

    name: str
    dim: int
    example: int
    max: int
    checked: tuple[int, ...]

    def to_dict(self) -> dict[str, int | list[int]]:
        """JSON form for the manifest's ``axes``."""
        return {
            "dim": self.dim,
            "min": 1,
            "max": self.max,
            "example": self.example,
            "checked": list(self.checked),
        }


DEFAULT_GROWTH = 4
"""With no bound from the model or the flag, an axis is exported up to this many times its example size."""


def example_sizes(axes: list[Axis], shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """Each non-batch axis's example size (every input that has the dimension must agree, and be 2 or more)."""
    sizes: dict[str, int] = {}
    for axis in axes[1:]:
        seen = {shape[axis.dim] for shape in shapes if len(shape) > axis.dim}
        if not seen:
            raise UsageError(f"--dynamic names {axis.name!r} at dimension {axis.dim}, which no input has.")
        if len(seen) > 1:
            raise UsageError(
                f"--dynamic {axis.name!r} is dimension {axis.dim} of every input, but the examples have sizes "
                f"{sorted(seen)} there; give examples of one size, or leave that position '_'."
            )
        size = seen.pop()
        if size < 2:
            raise UsageError(
                f"--dynamic {axis.name!r}: the example has size 1 there, which torch.export specializes; give an "
                "example of size 2 or more in that dimension."
            )
        sizes[axis.name] = size
    return sizes


def resolve_bounds(
    model: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    axes: list[Axis],
    examples: dict[str, int],
    max_batch: int,
) -> list[AxisPlan]:
    """Bounds of the non-batch axes: the flag's, else what torch.export infers from the model (``Dim.AUTO``),
    else ``DEFAULT_GROWTH`` times the example. A dimension the model fixes is refused in one sentence."""
    import torch

    extra = axes[1:]
    probe = [a for a in extra if a.max is None]
    inferred: dict[str, int | None] = {}
    if probe:
        batch = torch.export.Dim("batch", min=1, max=max(max_batch, 2))
        shapes = tuple(
            {0: batch, **{a.dim: torch.export.Dim.AUTO for a in probe if a.dim < t.dim()}} for t in args
        )
        try:
            program = torch.export.export(model, tuple(args), dynamic_shapes=shapes, strict=False)
        except Exception as exc:  # the exporter's own error types; export proper reports them with a hint
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise UsageError(
                f"torch.export cannot trace the model with --dynamic axes unbounded ({first}); give each a bound, "
                "e.g. --dynamic batch,seq:512, or leave the dimension fixed."
            ) from None
        placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
        user = [n for n in placeholders if n.name in set(program.graph_signature.user_inputs)]
        for axis in probe:
            bound: int | None = None
            for node, t in zip(user, args, strict=False):
                if axis.dim >= t.dim():
                    continue
                size = node.meta["val"].shape[axis.dim]
                if not isinstance(size, int) and getattr(size.node.expr, "is_number", False):
                    size = int(size.node.expr)  # a SymInt the trace pinned to one value
                if isinstance(size, int):
                    raise UsageError(
                        f"--dynamic {axis.name!r}: the model fixes dimension {axis.dim} of input {node.name!r} to "
                        f"{size}, so it cannot be dynamic; drop {axis.name} from --dynamic."
                    )
                rng = program.range_constraints.get(size.node.expr)
                upper = getattr(rng, "upper", None)
                if (
                    upper is not None
                    and getattr(upper, "is_finite", True)
                    and str(upper) not in ("oo", "int_oo")
                ):
                    value = int(upper)
                    bound = value if bound is None else min(bound, value)
            inferred[axis.name] = bound
    plans = []
    for axis in extra:
        example = examples[axis.name]
        bound = axis.max or inferred.get(axis.name) or DEFAULT_GROWTH * example
        if bound < example:
            raise UsageError(
                f"--dynamic {axis.name}:{bound} is below the example's size {example}; raise the bound or give a "
                "smaller example."
            )
        checked = tuple(sorted({1, example, bound}))
        plans.append(AxisPlan(name=axis.name, dim=axis.dim, example=example, max=bound, checked=checked))
    return plans


def export_dims(axes: list[Axis], plans: list[AxisPlan], ranks: list[int], max_batch: int) -> Any:
    """``dynamic_shapes`` for torch.export / the dynamo ONNX exporter (one ``Dim`` per name, shared by inputs)."""
    import torch

    if not axes:
        return None
    dims = {"batch": torch.export.Dim("batch", min=1, max=max(max_batch, 2))}
    for plan in plans:
        dims[plan.name] = torch.export.Dim(plan.name, min=1, max=plan.max)
    return tuple({a.dim: dims[a.name] for a in axes if a.dim < rank} for rank in ranks)

"""Where two runtimes part: the first layer whose output differs beyond tolerance between eager and an export.

Eager: a forward hook on every leaf module records its output, in the order the layers ran. ONNX: the
dynamo exporter tags every node with its module path (``pkg.torch.onnx.name_scopes``); the last node of
each module's scope is its output, added as an extra graph output of an in-memory copy and run in
onnxruntime on the same inputs. ``torch.export`` (``.pt2``): the program's nodes carry
``nn_module_stack``; an interpreter records the last node of each module. Layers are compared in eager's
order with the parity tolerances; the first one beyond them is reported with both tensors' statistics.
A layer whose export value has another shape (the exporter fused or reshaped it) is skipped and counted.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchscalpel.ship.parity import tolerance_for

DIFF_FORMATS = ("onnx", "exported")
"""Forms a layer diff can open (TorchScript keeps no module paths on its traced nodes)."""


def tensor_stats(a: np.ndarray) -> dict[str, Any]:
    """Shape, dtype, mean, std, min, max and non-finite count of one tensor (float64 arithmetic)."""
    x = a.astype(np.float64)
    finite = x[np.isfinite(x)]
    return {
        "shape": list(a.shape),
        "dtype": a.dtype.name,
        "mean": float(finite.mean()) if finite.size else None,
        "std": float(finite.std()) if finite.size else None,
        "min": float(finite.min()) if finite.size else None,
        "max": float(finite.max()) if finite.size else None,
        "nonfinite": int(x.size - finite.size),
    }


@dataclass(kw_only=True, slots=True)
class LayerDiff:
    """The result for one export: the first layer beyond tolerance (or none) and what was compared."""

    format: str
    compared: int
    skipped: int
    layer: str | None = None
    module: str | None = None
    max_abs: float | None = None
    atol: float | None = None
    rtol: float | None = None
    worst_index: list[int] = field(default_factory=list)
    eager: dict[str, Any] | None = None
    export: dict[str, Any] | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the manifest."""
        return asdict(self)

    def describe(self) -> str:
        """One paragraph for the terminal."""
        if self.note and self.compared == 0:
            return f"layer diff {self.format}: {self.note}"
        if self.layer is None:
            return f"layer diff {self.format}: all {self.compared} layers within tolerance" + (
                f" ({self.skipped} not comparable)" if self.skipped else ""
            )
        e, x = self.eager or {}, self.export or {}

        def fmt(s: dict[str, Any]) -> str:
            vals = [s.get(k) for k in ("mean", "std", "min", "max")]
            body = "/".join("nan" if v is None else f"{v:.4g}" for v in vals)
            return f"mean/std/min/max {body}" + (
                f", {s['nonfinite']} non-finite" if s.get("nonfinite") else ""
            )

        return (
            f"layer diff {self.format}: first layer beyond tolerance: {self.layer} ({self.module}), max abs "
            f"{self.max_abs:.3g} at {tuple(self.worst_index)} > atol {self.atol:g} + rtol {self.rtol:g} x |eager|; "
            f"eager {fmt(e)}; {self.format} {fmt(x)} (shape {tuple(e.get('shape', ()))}, "
            f"{self.compared} layers compared)"
        )


def eager_layers(model: Any, inputs: Sequence[np.ndarray]) -> list[tuple[str, str, np.ndarray]]:
    """(module path, class name, first output) of every leaf module, in the order they ran."""
    import torch

    seen: list[tuple[str, str, np.ndarray]] = []
    handles = []
    names = {m: n for n, m in model.named_modules()}

    def hook(mod: Any, _args: Any, out: Any) -> None:
        first = (
            out
            if isinstance(out, torch.Tensor)
            else next((o for o in out if isinstance(o, torch.Tensor)), None)
            if isinstance(out, (tuple, list))
            else None
        )
        if first is not None and names.get(mod):
            seen.append((names[mod], type(mod).__name__, first.detach().cpu().numpy().copy()))

    for mod in model.modules():
        if not list(mod.children()):
            handles.append(mod.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            model(*[torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])
    finally:
        for h in handles:
            h.remove()
    return seen


def onnx_layers(path: Path, inputs: Sequence[np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
    """Module path -> the output of the last ONNX node in that module's scope, for the paths in ``wanted``."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    last: dict[str, str] = {}
    for node in model.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        scopes = props.get("pkg.torch.onnx.name_scopes")
        if not scopes or not node.output:
            continue
        try:
            parts = ast.literal_eval(scopes)
        except (ValueError, SyntaxError):
            continue
        path_ = ".".join(p for p in parts[1:-1] if p)
        for depth in range(1, len(parts) - 1):  # a node inside a leaf also ends every enclosing scope
            prefix = ".".join(p for p in parts[1 : depth + 1] if p)
            if prefix in wanted:
                last[prefix] = node.output[0]
        if path_ in wanted:
            last[path_] = node.output[0]
    types = {vi.name: vi for vi in [*model.graph.value_info, *model.graph.output]}
    existing = {o.name for o in model.graph.output}
    for value in set(last.values()) - existing:
        model.graph.output.append(types[value] if value in types else onnx.ValueInfoProto(name=value))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    feed = {i.name: np.ascontiguousarray(a) for i, a in zip(session.get_inputs(), inputs, strict=True)}
    values = dict(zip(names, session.run(None, feed), strict=True))
    return {layer: values[v] for layer, v in last.items() if v in values}


def exported_layers(path: Path, inputs: Sequence[np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
    """Module path -> the value of the last node of that module in a ``torch.export`` program (``.pt2``)."""
    import torch

    program = torch.export.load(str(path))
    gm = program.module()
    last: dict[str, Any] = {}
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        for fqn, _cls in stack.values():
            clean = fqn.removeprefix("L['self'].").removeprefix("L['self']")
            if clean in wanted:
                last[clean] = node
    targets = {n: layer for layer, n in last.items()}
    found: dict[str, np.ndarray] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            out = super().run_node(n)
            if n in targets and isinstance(out, torch.Tensor):
                found[targets[n]] = out.detach().cpu().numpy().copy()
            return out

    with torch.inference_mode():
        Recorder(gm).run(*[torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])
    return found


def layer_diff(
    model: Any,
    fmt: str,
    path: Path,
    inputs: Sequence[np.ndarray],
    override: tuple[float | None, float | None] = (None, None),
) -> LayerDiff:
    """Compare every leaf layer's output between eager and the export at ``path`` on ``inputs``."""
    if fmt not in DIFF_FORMATS:
        return LayerDiff(
            format=fmt, compared=0, skipped=0, note="TorchScript keeps no module paths to compare"
        )
    layers = eager_layers(model, inputs)
    wanted = {name for name, _, _ in layers}
    try:
        got = (onnx_layers if fmt == "onnx" else exported_layers)(path, inputs, wanted)
    except Exception as exc:  # a runtime that cannot run the instrumented copy: say so, keep the export
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        return LayerDiff(
            format=fmt, compared=0, skipped=len(layers), note=f"could not instrument it ({first})"
        )
    compared = skipped = 0
    for name, cls, want in layers:
        have = got.get(name)
        if have is None or have.shape != want.shape:
            skipped += 1
            continue
        compared += 1
        atol, rtol = tolerance_for(want.dtype, override)
        w64, h64 = want.astype(np.float64), have.astype(np.float64)
        diff = np.abs(h64 - w64)
        diff = np.where(np.isnan(w64) & np.isnan(h64), 0.0, np.nan_to_num(diff, nan=np.inf))
        bad = diff > atol + rtol * np.abs(np.nan_to_num(w64))
        if bad.any():
            worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
            return LayerDiff(
                format=fmt,
                compared=compared,
                skipped=skipped,
                layer=name,
                module=cls,
                max_abs=float(diff.max()),
                atol=atol,
                rtol=rtol,
                worst_index=[int(i) for i in worst],
                eager=tensor_stats(want),
                export=tensor_stats(have),
            )
    return LayerDiff(format=fmt, compared=compared, skipped=skipped)

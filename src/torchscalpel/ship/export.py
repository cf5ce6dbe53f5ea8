"""``scalpel export``: weights into the model, export to each format, prove parity, write the bundle.

The steps, in order: build the model (eval mode), load and strip the weights, run eager on the
example, save ``model.safetensors``, export each format, reload each file from disk and compare
with eager at batch 1, 7 and the maximum, optionally quantize, time every form at batch 1 and
the maximum, then hash everything into ``manifest.json``. A parity failure still writes the
manifest (the figures are kept) but marks it failed, and ``scalpel serve`` refuses such a bundle.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchscalpel.errors import ScalpelError, UsageError
from torchscalpel.record import now_timestamp
from torchscalpel.ship import bundle as bundle_mod
from torchscalpel.ship.axes import (
    AxisPlan,
    check_opset,
    example_sizes,
    export_dims,
    parse_dynamic,
    resolve_bounds,
    runtime_note,
)
from torchscalpel.ship.factory import build_model, forward_input_names
from torchscalpel.ship.latency import measure_latency
from torchscalpel.ship.parity import ParityCheck, run_parity
from torchscalpel.ship.precision import PRECISIONS
from torchscalpel.ship.runners import (
    OrtRunner,
    Runner,
    TorchRunner,
    exported_runner,
    flatten_outputs,
    gpu_forms,
    provider_list,
    torchscript_runner,
)
from torchscalpel.ship.specs import ExampleInput, dtype_name, make_batch, parse_examples, with_sizes
from torchscalpel.ship.weights import LoadedWeights, load_weights

FORMATS = ("onnx", "exported", "torchscript")
PARITY_BATCHES = (1, 7)


@dataclass(kw_only=True, slots=True)
class ExportOptions:
    """Everything ``scalpel export`` was asked to do (validated in ``__post_init__``)."""

    model: str
    """``MODULE:FACTORY``."""
    factory_args: str | None = None
    weights: Path | None = None
    """Checkpoint to load; ``None`` exports the factory's own initial weights (tests, demos)."""
    examples: list[str] = field(default_factory=list)
    formats: tuple[str, ...] = ("onnx", "exported")
    dynamic: str = "batch"
    """``batch`` (first dim dynamic up to ``max_batch``), ``none`` (shapes fixed to the example), or named
    dimensions by position, ``batch,seq`` / ``batch,seq:512`` / ``batch,_,h,w`` (``ship.axes``)."""
    opset: int | None = None
    """ONNX opset to write (default: the exporter's); checked against the installed onnx and onnxruntime."""
    max_batch: int = 32
    quantize: str | None = None
    out: Path = Path("bundle")
    atol: float | None = None
    rtol: float | None = None
    output_names: list[str] | None = None
    preprocess: dict[str, Any] | None = None
    """A declared spec (an object with ``steps``: applied by serve, see ``ship.preprocess``) or free-form
    metadata for clients (anything else: stored and shown, not applied)."""
    transform: str | None = None
    """``[INPUT=]MODULE:NAME``: the training script's evaluation transform, recorded as data (``ship.transforms``)."""
    transform_from: str | None = None
    """``RUN[:N]``: the transform the runtime saw on a DataLoader's dataset in a recorded run (``ship.transforms``)."""
    raw_example: Path | None = None
    """Raw samples (a plain .npy, first dim the samples) for the preprocessing parity check."""
    calibration: Path | None = None
    """Training samples for ``--quantize int8-static`` (a .npy for one input, a .safetensors naming each)."""
    layer_diff: bool = False
    """Compare every layer's output between eager and each ONNX / ``.pt2`` export (always done for a form
    that fails parity): the first layer beyond tolerance, with statistics (``ship.layerdiff``)."""
    trust: bool = False
    sign_key: Path | None = None
    """HMAC key file: a torchscalpel checkpoint must carry a matching signature (``Checkpointer(sign_key=)``)."""
    allow_nonfinite: bool = False
    """Load weights holding NaN, infinity or magnitudes over ``weights.MAX_ABS_WEIGHT`` (refused otherwise)."""
    precision: tuple[str, ...] = ()
    """Reduced-precision forms to add (``fp16``: ONNX, ``bf16``: torch program), each kept only where parity
    holds within its dtype's tolerance (``ship.precision``)."""
    compile: bool = False
    """Time a ``torch.compile``d ``.pt2`` program (``pt2+compile``; eager's when no .pt2 is exported) beside the
    others, after a warm-up at every timed batch."""
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown or not self.formats:
            raise UsageError(
                f"--formats takes a comma list of {', '.join(FORMATS)}; got {','.join(self.formats)!r}."
            )
        parse_dynamic(self.dynamic)
        if self.opset is not None:
            if "onnx" not in self.formats:
                raise UsageError("--opset sets the ONNX opset; add onnx to --formats, or drop --opset.")
            check_opset(self.opset)
        if self.max_batch < 1:
            raise UsageError("--max-batch must be at least 1.")
        if self.quantize is not None:
            if self.quantize not in ("int8-dynamic", "int8-static"):
                raise UsageError(f"--quantize takes 'int8-dynamic' or 'int8-static', not {self.quantize!r}.")
            if "onnx" not in self.formats:
                raise UsageError(
                    f"--quantize {self.quantize} quantizes the ONNX export; add onnx to --formats."
                )
        if set(self.precision) - set(PRECISIONS):
            raise UsageError(
                f"--precision takes a comma list of {', '.join(PRECISIONS)}; got {','.join(self.precision)!r}."
            )
        if "fp16" in self.precision and "onnx" not in self.formats:
            raise UsageError("--precision fp16 converts the ONNX export; add onnx to --formats.")
        if self.calibration is not None and self.quantize != "int8-static":
            raise UsageError("--calibration feeds --quantize int8-static; add it, or drop --calibration.")
        for flag, value in (("--atol", self.atol), ("--rtol", self.rtol)):
            if value is not None and value < 0:
                raise UsageError(f"{flag} must not be negative.")


@dataclass(kw_only=True, slots=True)
class ExportResult:
    """The written bundle and whether parity passed."""

    path: Path
    manifest: dict[str, Any]
    checks: list[ParityCheck]

    @property
    def passed(self) -> bool:
        """True when every parity check passed."""
        return bool(self.checks) and all(c.passed for c in self.checks)


def _prepare_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(
            f"--out {out} already exists and is not empty; choose a new folder so nothing is overwritten."
        )
    out.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def _quiet():
    """Silence exporter chatter (progress prints, deprecation warnings) but keep it for error messages."""
    buf = io.StringIO()
    onnx_log = logging.getLogger("torch.onnx")
    level = onnx_log.level
    onnx_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            warnings.simplefilter("ignore")
            yield buf
    finally:
        onnx_log.setLevel(level)


def _export_one(
    fmt: str,
    model: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    dyn: Any,
    in_names: list[str],
    out_names: list[str],
    out: Path,
    opset: int | None = None,
) -> Path:
    path = out / bundle_mod.ARTIFACT_FILES[fmt]
    with _quiet():
        try:
            if fmt == "exported":
                program = torch.export.export(model, args, dynamic_shapes=dyn)
                torch.export.save(program, str(path))
            elif fmt == "onnx":
                torch.onnx.export(
                    model,
                    args,
                    str(path),
                    dynamo=True,
                    dynamic_shapes=dyn,
                    input_names=in_names,
                    output_names=out_names,
                    opset_version=opset,
                )
            else:
                traced = torch.jit.trace(model, args, check_trace=False)
                torch.jit.save(traced, str(path))
        except Exception as exc:  # exporters raise dozens of types; the user needs the first line and a hint
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise ScalpelError(
                f"Exporting to {fmt} failed: {first}. Data-dependent Python control flow or unsupported ops are the "
                "usual cause; try --formats without it, or --dynamic none."
            ) from None
    return path


def _to_numpy(tensors: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    return [t.numpy() for t in tensors]


def _input_specs(inputs: list[ExampleInput], names: list[str], axes: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": n,
            "dtype": dtype_name(i.dtype),
            "shape": [None if any(a.dim == d for a in axes) else s for d, s in enumerate(i.shape)],
            "dynamic_dims": {str(a.dim): a.name for a in axes if a.dim < len(i.shape)},
            **({"range": [i.low, i.high]} if not i.dtype.is_floating_point and i.data is None else {}),
        }
        for n, i in zip(names, inputs, strict=True)
    ]


def export_bundle(opts: ExportOptions, log: Callable[[str], None] = print) -> ExportResult:
    """Run the whole export; returns the result (``passed`` False on a parity failure)."""
    inputs = parse_examples(opts.examples)
    if any(i.dtype == torch.bfloat16 for i in inputs):
        raise UsageError("bfloat16 example inputs cannot be checked in onnxruntime; give float32 inputs.")
    model = build_model(opts.model, opts.factory_args)
    loaded: LoadedWeights | None = None
    if opts.weights is not None:
        loaded = load_weights(
            model,
            opts.weights,
            trust=opts.trust,
            sign_key=opts.sign_key,
            allow_nonfinite=opts.allow_nonfinite,
        )
        for note in loaded.notes:
            log(f"weights: {note}")
        if loaded.stripped:
            log("stripped prefixes: " + ", ".join(f"{p!r} from {n} keys" for p, n in loaded.stripped.items()))
    model.eval()
    if any(m.training for m in model.modules()):
        raise ScalpelError(
            "The model stays in training mode after .eval(); check its train()/eval() overrides."
        )
    named = [i.name for i in inputs]
    in_names = [n for n in named if n] if all(named) else forward_input_names(model, len(inputs))

    from torchscalpel.ship.preparity import bound_text, check_fixed_text, resolve

    axes = parse_dynamic(opts.dynamic)
    pre = resolve(
        transform=opts.transform,
        preprocess=opts.preprocess,
        in_names=in_names,
        shapes={n: i.shape for n, i in zip(in_names, inputs, strict=True)},
        dynamic_dims=frozenset(a.dim for a in axes),
        transform_from=opts.transform_from,
    )
    if pre.text and not any(a.dim == 1 for a in axes):
        check_fixed_text(pre, inputs[in_names.index(pre.spec["input"])].shape[1])  # type: ignore[index]
    dynamic = bool(axes)
    example_batch = inputs[0].shape[0]
    export_batch = 2 if dynamic else example_batch  # batch 1 invites 0/1 specialization in torch.export
    examples = example_sizes(axes, [i.shape for i in inputs])
    args = make_batch(inputs, export_batch, opts.seed)
    try:
        with torch.inference_mode():
            eager_out = flatten_outputs(model(*args))
    except Exception as exc:  # the user's forward on the user's example: name both
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"The model fails on the --example inputs ({first}); give one --example per forward() "
            "argument, with the shape it expects."
        ) from None
    _prepare_out(opts.out)
    out_names = opts.output_names or (
        ["output"] if len(eager_out) == 1 else [f"output_{i}" for i in range(len(eager_out))]
    )
    if len(out_names) != len(eager_out):
        raise UsageError(
            f"--output-names has {len(out_names)} names but the model returns {len(eager_out)} outputs."
        )

    from safetensors.torch import save_model

    save_model(model, str(opts.out / bundle_mod.ARTIFACT_FILES["weights"]))
    artifacts = {"weights": bundle_mod.ARTIFACT_FILES["weights"]}
    for name, data in pre.files.items():  # the tokenizer's files: data the manifest hashes like any artifact
        (opts.out / name).write_bytes(data)
        artifacts["tokenizer"] = name
    plans: list[AxisPlan] = (
        resolve_bounds(model, args, axes, examples, opts.max_batch) if len(axes) > 1 else []
    )
    seq_plan = next((p for p in plans if p.dim == 1), None)
    if pre.text and seq_plan is not None:
        bound_text(pre, seq_plan.max)
    dyn: Any = export_dims(axes, plans, [len(i.shape) for i in inputs], opts.max_batch)

    eager = TorchRunner(model, "eager")
    runners: list[Runner] = []
    absent_forms: dict[str, str] = {}
    export_s: dict[str, float] = {}
    for fmt in opts.formats:
        # a line before each phase that can take long (export, parity, quantize, latency): a large
        # model's export ran for minutes without a word
        log(f"exporting {fmt} ...")
        t0 = time.perf_counter()
        path = _export_one(fmt, model, args, dyn, in_names, out_names, opts.out, opts.opset)
        export_s[fmt] = round(time.perf_counter() - t0, 3)
        artifacts[fmt] = path.name
        with _quiet():
            runners.append(
                OrtRunner(path, threads=1)
                if fmt == "onnx"
                else exported_runner(path)
                if fmt == "exported"
                else torchscript_runner(path)
            )
        if fmt == "onnx":
            # the GPU deployment's figures beside the CPU ones: same file, CUDA's (and TensorRT's) provider
            import onnxruntime

            rows, absent_forms = gpu_forms(onnxruntime.get_available_providers(), onnxruntime.__version__)
            for form in rows:
                with _quiet():
                    runners.append(OrtRunner(path, name=form, threads=1, providers=provider_list(form)))
        log(f"wrote {fmt + ':':<12} {path} ({export_s[fmt]:.1f} s)")  # not "exported exported"

    extra, forms = _extra_forms(opts, model, args, dyn, runners, artifacts, log)
    sizes = (
        sorted({*(b for b in PARITY_BATCHES if b <= opts.max_batch), opts.max_batch})
        if dynamic
        else [example_batch]
    )
    batches = {s: _to_numpy(make_batch(inputs, s, opts.seed + 1)) for s in sizes}
    log(f"parity: {len(runners)} format(s) vs eager at batch {', '.join(map(str, sizes))} ...")
    checks = run_parity(eager, runners, batches, out_names, (opts.atol, opts.rtol))
    out_dims = _output_dims(eager, inputs, plans, opts.seed)
    for plan in plans:  # every other size of each named axis, at one batch, the others at their example size
        batch = min(7, opts.max_batch)
        others = [s for s in plan.checked if s != plan.example]
        log(f"parity: {plan.name} at {', '.join(map(str, others))} (batch {batch}) ...")
        for size in others:
            varied = [with_sizes(i, {plan.dim: size}) for i in inputs]
            found = run_parity(
                eager,
                runners,
                {batch: _to_numpy(make_batch(varied, batch, opts.seed + 3))},
                out_names,
                (opts.atol, opts.rtol),
            )
            for c in found:
                c.sizes = f"{plan.name}={size}"
            checks.extend(found)
    pre_summary = None
    if pre.spec is not None:
        pre_checks, pre_summary = _preprocess_parity(
            opts, pre, inputs, in_names, eager, runners, out_names, dynamic, log
        )
        checks.extend(pre_checks)

    diffs = _layer_diffs(opts, model, checks, artifacts, batches, log)
    if extra:
        extra = _check_extra(opts, eager, extra, forms, batches, out_names, log)

    # Timings run single-threaded: torch's OpenMP pool and onnxruntime's pool in one process fight
    # over the cores (measured: eager batch 1 went from 0.12 ms to 20 ms on 2 shared cores).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        quant, latency = _quantize_and_time(
            opts, eager, [*runners, *extra], batches, sizes, artifacts, checks, log, inputs, in_names
        )
    finally:
        torch.set_num_threads(threads)
    _settle_extra(opts, forms, latency, artifacts, log)

    import onnx
    import onnxruntime

    manifest: dict[str, Any] = {
        "format": bundle_mod.FORMAT,
        "format_version": bundle_mod.FORMAT_VERSION,
        "created": now_timestamp(),
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
            "torchscalpel": _tool_version(),
        },
        "model": {
            "factory": opts.model,
            "factory_args": opts.factory_args,
            "class": type(model).__name__,
            "weights": str(opts.weights) if opts.weights else None,
            "weights_loading": loaded.to_dict() if loaded else None,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
        "inputs": _input_specs(inputs, in_names, axes),
        "outputs": [
            {
                "name": n,
                "dtype": dtype_name(t.dtype),
                "shape": [None if (dynamic and d == 0) or d in dims else s for d, s in enumerate(t.shape)],
                **({"dynamic_dims": {str(d): a for d, a in dims.items()}} if dims else {}),
            }
            for n, t, dims in zip(out_names, eager_out, out_dims, strict=True)
        ],
        "max_batch": opts.max_batch if dynamic else example_batch,
        "dynamic": opts.dynamic,
        "axes": {
            **({"batch": {"dim": 0, "min": 1, "max": opts.max_batch}} if dynamic else {}),
            **{p.name: p.to_dict() for p in plans},
        },
        "onnx_opset": _onnx_opset(opts.out / artifacts["onnx"]) if "onnx" in artifacts else None,
        "preprocessing": pre.manifest,
        "preprocessing_parity": pre_summary,
        "artifacts": artifacts,
        "export_seconds": export_s,
        "latency_threads": 1,
        "parity": {
            "passed": bool(checks) and all(c.passed for c in checks),
            "batches": sizes,
            "checks": [c.to_dict() for c in checks],
        },
        "layer_diff": [d.to_dict() for d in diffs] or None,
        "quantization": quant,
        "latency_ms": latency,
        "forms_absent": absent_forms or None,
        "precision": {k: v for k, v in forms.items() if k in PRECISIONS} or None,
        "compile": forms.get("compile"),
    }
    manifest["files"] = bundle_mod.hash_files(opts.out)
    key = None
    if opts.sign_key is not None:
        from torchscalpel.distributed.manifest import read_key

        key = read_key(opts.sign_key)
    bundle_mod.write_manifest(opts.out, manifest, key=key)
    return ExportResult(path=opts.out, manifest=manifest, checks=checks)


def _extra_forms(
    opts: ExportOptions,
    model: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    dyn: Any,
    runners: list[Runner],
    artifacts: dict[str, str],
    log: Callable[[str], None],
) -> tuple[list[Runner], dict[str, dict[str, Any]]]:
    """The reduced-precision and compiled forms asked for, each with its report (a form that cannot be built
    or loaded is reported dropped with the reason, never fatal: the fp32 bundle stands without it)."""
    from torchscalpel.ship import precision as prec

    extra: list[Runner] = []
    forms: dict[str, dict[str, Any]] = {}
    for p in opts.precision:
        form, path = prec.FORM[p], opts.out / prec.FILES[p]
        atol, rtol = prec.tolerance(p)
        report: dict[str, Any] = {"form": form, "file": path.name, "tolerance": [atol, rtol], "kept": False}
        forms[p] = report
        log(f"exporting {form} ...")
        try:
            with _quiet():
                if p == "fp16":
                    prec.write_fp16_onnx(opts.out / artifacts["onnx"], path)
                    extra.append(OrtRunner(path, name=form, threads=1))
                else:
                    prec.write_bf16_program(model, args, dyn, path)
                    extra.append(prec.load_bf16_program(path, form))
        except Exception as exc:  # converter, exporter or runtime refusals: the form is dropped, with why
            report["reason"] = (
                f"could not be built or loaded here: {(str(exc).splitlines() or [type(exc).__name__])[0][:200]}"
            )
            path.unlink(missing_ok=True)
            log(f"{form}: dropped ({report['reason']})")
    if opts.compile:
        base = next((r for r in runners if r.name == "exported"), None)
        source = base if isinstance(base, TorchRunner) else TorchRunner(model, "eager")
        name = "pt2+compile" if source.name == "exported" else "eager+compile"
        extra.append(prec.compiled(source, name))
        forms["compile"] = {"form": name, "of": source.name, "kept": None}
    return extra, forms


def _check_extra(
    opts: ExportOptions,
    eager: Runner,
    extra: list[Runner],
    forms: dict[str, dict[str, Any]],
    batches: dict[int, list[np.ndarray]],
    out_names: list[str],
    log: Callable[[str], None],
) -> list[Runner]:
    """Parity of each extra form against fp32 eager at every parity batch, under its stated tolerance; the
    compiled form's first call at each batch is its compile (timed: what serve's warm-up pays). Returns the
    forms that ran (one that fails to run is dropped here, with the runtime's reason, and not timed)."""
    from torchscalpel.ship.parity import run_parity
    from torchscalpel.ship.precision import FILES as prec_files

    by_form = {v["form"]: (k, v) for k, v in forms.items()}
    ran: list[Runner] = []
    for runner in extra:
        key, report = by_form[runner.name]
        override = tuple(report["tolerance"]) if key in PRECISIONS else (opts.atol, opts.rtol)
        log(f"parity: {runner.name} vs eager at batch {', '.join(map(str, batches))} ...")
        t0 = time.perf_counter()
        found = run_parity(eager, [runner], batches, out_names, override)
        if key == "compile":
            report["first_calls_s"] = round(time.perf_counter() - t0, 3)
        report["parity_passed"] = bool(found) and all(c.passed for c in found)
        report["max_abs"] = max((c.max_abs for c in found), default=None)
        report["max_rel"] = max((c.max_rel for c in found), default=None)
        report["checks"] = [c.to_dict() for c in found]
        failed = next((c.note for c in found if c.note.startswith("failed to run")), None)
        if failed is None:
            ran.append(runner)
        else:
            report["reason"] = f"{failed[:200]} here"
            report["kept"] = False if key in PRECISIONS else None
            if key in PRECISIONS:
                (opts.out / prec_files[key]).unlink(missing_ok=True)
            log(f"{runner.name}: dropped ({report['reason']})")
    return ran


def _settle_extra(
    opts: ExportOptions,
    forms: dict[str, dict[str, Any]],
    latency: dict[str, dict[str, float]],
    artifacts: dict[str, str],
    log: Callable[[str], None],
) -> None:
    """Keep a reduced-precision file only where parity held; every form's speed beside its fp32 peer."""
    from torchscalpel.ship import precision as prec

    for key, report in forms.items():
        form = report["form"]
        if form not in next(iter(latency.values()), {}):
            continue  # never built: its reason is already set
        peer = "onnx" if key == "fp16" else report.get("of", "exported")
        peer = peer if peer in next(iter(latency.values())) else "eager"
        report["peer"] = peer
        report["latency_ms"] = {b: row[form] for b, row in latency.items()}
        report["speedup_vs_peer"] = {
            b: round(row[peer] / max(row[form], 1e-9), 3) for b, row in latency.items()
        }
        speed = ", ".join(f"{v:.2f}x {peer} at batch {b}" for b, v in report["speedup_vs_peer"].items())
        if key == "compile":
            report["kept"] = None
            verdict = "parity ok" if report.get("parity_passed") else "parity FAILED"
            log(f"{form}: {verdict} (max abs {report.get('max_abs', 0):.3g}), {speed}")
            continue
        atol, rtol = report["tolerance"]
        report["kept"] = bool(report.get("parity_passed"))
        report["reason"] = (
            f"within the stated tolerance (atol {atol:g}, rtol {rtol:g}) of fp32 eager at every parity batch"
            if report["kept"]
            else f"outside the stated tolerance (atol {atol:g}, rtol {rtol:g}) of fp32 eager"
        )
        path = opts.out / prec.FILES[key]
        if report["kept"]:
            artifacts[prec.ARTIFACT[key]] = path.name
        else:
            path.unlink(missing_ok=True)
        log(
            f"{form}: {'kept' if report['kept'] else 'dropped'} ({report['reason']}; max abs {report['max_abs']:.3g}), {speed}"
        )


def _layer_diffs(
    opts: ExportOptions,
    model: torch.nn.Module,
    checks: list[ParityCheck],
    artifacts: dict[str, str],
    batches: dict[int, list[np.ndarray]],
    log: Callable[[str], None],
) -> list[Any]:
    """Layer diffs of the forms asked for (--layer-diff) or failing parity, on the largest parity batch."""
    from torchscalpel.ship.layerdiff import layer_diff

    failing = {c.format.removesuffix("+pre") for c in checks if not c.passed}
    forms = [f for f in opts.formats if f in artifacts and (opts.layer_diff or f in failing)]
    if not forms:
        return []
    inputs = batches[max(batches)]
    log(f"layer diff: {', '.join(forms)} vs eager, layer by layer at batch {max(batches)} ...")
    diffs = []
    for fmt in forms:
        with _quiet():
            diff = layer_diff(model, fmt, opts.out / artifacts[fmt], inputs, (opts.atol, opts.rtol))
        log(diff.describe())
        diffs.append(diff)
    return diffs


def _output_dims(
    eager: Runner, inputs: list[ExampleInput], plans: list[AxisPlan], seed: int
) -> list[dict[int, str]]:
    """Per output, the dimensions (besides the batch) that follow a named axis: their size changes with it."""
    base = eager(_to_numpy(make_batch(inputs, 2, seed)))
    dims: list[dict[int, str]] = [{} for _ in base]
    for plan in plans:
        other = plan.max if plan.max != plan.example else 1
        got = eager(_to_numpy(make_batch([with_sizes(i, {plan.dim: other}) for i in inputs], 2, seed)))
        for k, (a, b) in enumerate(zip(base, got, strict=True)):
            for d in range(1, min(a.ndim, b.ndim)):
                if a.shape[d] != b.shape[d]:
                    dims[k][d] = plan.name
    return dims


def _onnx_opset(path: Path) -> dict[str, Any]:
    """The default-domain opset the ONNX file declares, and the onnxruntime releases that run it."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return {"opset": opset, "runs_on": runtime_note(opset) if opset else None}


def _preprocess_parity(
    opts: ExportOptions,
    pre: Any,
    inputs: list[ExampleInput],
    in_names: list[str],
    eager: Runner,
    runners: list[Runner],
    out_names: list[str],
    dynamic: bool,
    log: Callable[[str], None],
) -> tuple[list[ParityCheck], dict[str, Any]]:
    """Raw samples through the training transform + eager and through the recorded spec + every export."""
    from torchscalpel.ship.preparity import raw_samples, run_preprocess_parity

    spec = pre.spec
    if pre.text:
        return _text_parity(opts, pre, inputs, in_names, eager, runners, out_names, dynamic, log)
    index = in_names.index(spec["input"])
    samples = raw_samples(spec, opts.raw_example, inputs[index].shape, opts.seed)
    if not dynamic:  # a fixed-batch export takes exactly its batch
        want = inputs[0].shape[0]
        samples = (samples * (-(-want // len(samples))))[:want]
    else:
        samples = samples[: opts.max_batch]
    others = dict(zip(in_names, _to_numpy(make_batch(inputs, len(samples), opts.seed + 2)), strict=True))
    log(
        f"parity: {len(samples)} raw sample(s) through the training transform and the recorded preprocessing ..."
    )
    return run_preprocess_parity(
        pre,
        samples,
        in_names,
        others,
        eager,
        runners,
        out_names,
        (opts.atol, opts.rtol),
        others[spec["input"]].dtype,
    )


def _text_parity(
    opts: ExportOptions,
    pre: Any,
    inputs: list[ExampleInput],
    in_names: list[str],
    eager: Runner,
    runners: list[Runner],
    out_names: list[str],
    dynamic: bool,
    log: Callable[[str], None],
) -> tuple[list[ParityCheck], dict[str, Any]]:
    """Raw texts through the training tokenizer + eager and through the bundle's tokenizer files + every export."""
    from torchscalpel.ship.preparity import run_text_parity
    from torchscalpel.ship.textprep import raw_texts

    texts = raw_texts(pre.spec, opts.out, opts.raw_example, opts.seed)
    if not dynamic:
        want = inputs[0].shape[0]
        texts = (texts * (-(-want // len(texts))))[:want]
    else:
        texts = texts[: opts.max_batch]
    others = dict(zip(in_names, _to_numpy(make_batch(inputs, len(texts), opts.seed + 2)), strict=True))
    log(f"parity: {len(texts)} raw text(s) through the training tokenizer and the bundle's tokenizer ...")
    return run_text_parity(
        pre, texts, opts.out, in_names, others, eager, runners, out_names, (opts.atol, opts.rtol)
    )


def _quantize_and_time(
    opts: ExportOptions,
    eager: Runner,
    runners: list[Runner],
    batches: dict[int, list[np.ndarray]],
    sizes: list[int],
    artifacts: dict[str, str],
    checks: list[ParityCheck],
    log: Callable[[str], None],
    inputs: list[ExampleInput],
    in_names: list[str],
) -> tuple[dict[str, Any] | None, dict[str, dict[str, float]]]:
    """Optional int8 quantization (only after parity passed) and latency of every form."""
    quant: dict[str, Any] | None = None
    if opts.quantize == "int8-static" and checks and all(c.passed for c in checks):
        return _static_int8(opts, eager, runners, batches, sizes, artifacts, log, inputs, in_names)
    if opts.quantize and checks and all(c.passed for c in checks):
        from torchscalpel.ship.quantize import evaluate, quantize_onnx

        qpath = opts.out / bundle_mod.ARTIFACT_FILES["onnx_int8"]
        log(f"int8: quantizing the ONNX export ({opts.quantize}) ...")
        quantize_onnx(opts.out / artifacts["onnx"], qpath)
        artifacts["onnx_int8"] = qpath.name
        fp32 = next(r for r in runners if r.name == "onnx")
        report = evaluate(
            eager, fp32, OrtRunner(qpath, name="onnx-int8", threads=1), batches, opts.quantize, qpath.name
        )
        quant = report.to_dict()
        log(
            f"int8: max abs error {report.max_abs_error:.3g}, top-1 agreement "
            f"{'n/a' if report.top1_agreement is None else f'{report.top1_agreement:.3f}'}, "
            f"{report.speedup:.2f}x vs fp32 ONNX at batch {report.batch}"
        )
    timed = sorted({sizes[0], sizes[-1]})
    log(f"latency: timing {len(runners) + 1} form(s) at batch {', '.join(map(str, timed))} ...")
    latency = {str(s): measure_latency([eager, *runners], batches[s]) for s in timed}
    return quant, latency


def _calibration(opts: ExportOptions, inputs: list[ExampleInput]) -> tuple[list[np.ndarray], str]:
    """Calibration rows per input: --calibration, else the --example files' rows, else random rows (said so)."""
    from torchscalpel.ship.specs import parse_example

    if opts.calibration is not None:
        found = parse_example(str(opts.calibration))
        if len(found) != len(inputs) or any(f.data is None for f in found):
            raise UsageError(
                f"--calibration {opts.calibration} holds {len(found)} array(s); the model takes {len(inputs)} inputs "
                "(a .npy for one input, a .safetensors naming each)."
            )
        return [
            f.data.numpy() for f in found if f.data is not None
        ], f"{opts.calibration.name} (--calibration)"
    if all(i.data is not None for i in inputs):
        return [i.data.numpy() for i in inputs if i.data is not None], "the --example files' rows"
    rows = _to_numpy(make_batch(inputs, 64, opts.seed + 5))
    return rows, "64 random rows (no training samples given: pass --calibration for real activation ranges)"


def _static_int8(
    opts: ExportOptions,
    eager: Runner,
    runners: list[Runner],
    batches: dict[int, list[np.ndarray]],
    sizes: list[int],
    artifacts: dict[str, str],
    log: Callable[[str], None],
    inputs: list[ExampleInput],
    in_names: list[str],
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """Calibrated int8 (QDQ), in the latency table beside fp32, kept only when faster at every timed batch and
    within the int8 tolerance of eager; the manifest says which, and why."""
    from torchscalpel.ship.parity import INT8_TOLERANCE, compare
    from torchscalpel.ship.quantize import QuantReport, calibration_batches, quantize_static_onnx

    rows, source = _calibration(opts, inputs)
    qpath = opts.out / bundle_mod.ARTIFACT_FILES["onnx_int8"]
    log(
        f"int8: calibrating on {rows[0].shape[0]} row(s) from {source.split(' (')[0]} and quantizing (int8-static) ..."
    )
    quantize_static_onnx(opts.out / artifacts["onnx"], qpath, calibration_batches(rows), in_names)
    int8 = OrtRunner(qpath, name="onnx-int8", threads=1)
    max_abs, agree, total, within = 0.0, 0, 0, True
    for size, batch in batches.items():
        want, got = eager(batch), int8(batch)
        names = [f"output_{i}" for i in range(len(want))]
        for c in compare("onnx-int8", size, names, want, got, INT8_TOLERANCE):
            within = within and c.passed
            max_abs = max(max_abs, c.max_abs)
        if want[0].ndim == 2 and want[0].shape[1] > 1:
            agree += int(np.sum(np.argmax(want[0], -1) == np.argmax(got[0], -1)))
            total += want[0].shape[0]
    timed = sorted({sizes[0], sizes[-1]})
    log(f"latency: timing {len(runners) + 2} form(s) at batch {', '.join(map(str, timed))} ...")
    latency = {str(s): measure_latency([eager, *runners, int8], batches[s]) for s in timed}
    speedups = {b: round(row["onnx"] / max(row["onnx-int8"], 1e-9), 3) for b, row in latency.items()}
    faster = all(v > 1.0 for v in speedups.values())
    kept = faster and within
    reason = (
        "faster than fp32 ONNX at every timed batch and within the int8 tolerance"
        if kept
        else "; ".join(
            r
            for r in (
                "" if faster else "not faster than fp32 ONNX at every timed batch",
                ""
                if within
                else f"outside the int8 tolerance (atol {INT8_TOLERANCE[0]:g}, rtol {INT8_TOLERANCE[1]:g})",
            )
            if r
        )
    )
    big = str(timed[-1])
    report = QuantReport(
        method="int8-static",
        file=qpath.name,
        max_abs_error=max_abs,
        top1_agreement=(agree / total) if total else None,
        latency_ms_fp32=latency[big]["onnx"],
        latency_ms_int8=latency[big]["onnx-int8"],
        speedup=speedups[big],
        batch=int(big),
        parity_passed=within,
        speedups=speedups,
        kept=kept,
        reason=reason,
        calibration=source,
    )
    del int8
    if kept:
        artifacts["onnx_int8"] = qpath.name
    else:
        qpath.unlink()
    log(
        f"int8: {'kept' if kept else 'dropped'} ({reason}): "
        + ", ".join(f"{v:.2f}x at batch {b}" for b, v in speedups.items())
        + f", max abs error {max_abs:.3g}"
    )
    return report.to_dict(), latency


def _tool_version() -> str:
    from torchscalpel.version import __version__

    return __version__

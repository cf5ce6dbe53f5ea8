"""``scalpel export``: turn a trained model into a verified bundle (see docs/export.md)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from torchscalpel.cli.common import default_run_dir
from torchscalpel.errors import UsageError
from torchscalpel.fileio import write_output_text
from torchscalpel.units import float_type, int_type

MAX_BATCH = 65536
"""The largest --max-batch accepted: beyond any served batch, and a bound before anything is allocated."""
MAX_EXAMPLE_BYTES = 4 << 30
"""The largest example input (at --max-batch rows) the parity check may allocate."""
_SPEC = re.compile(r"^\s*(?:\w+\s*=\s*)?(?P<dtype>[a-z0-9_]+)\s*\[(?P<shape>[^\]]*)\]")
_ITEMSIZE = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "int16": 2,
    "float32": 4,
    "float": 4,
    "int32": 4,
    "int": 4,
    "float64": 8,
    "double": 8,
    "int64": 8,
    "long": 8,
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``export`` sub-parser."""
    p = subparsers.add_parser(
        "export",
        help="export a trained model (ONNX, torch.export, TorchScript) with a parity check, into a bundle",
        description="Load weights into your model, export it, prove each export matches eager, write a bundle.",
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="MODULE:FACTORY",
        help="callable that builds the model, e.g. mypkg.models:make_model or path/model.py:Net",
    )
    p.add_argument("--factory-args", metavar="JSON", help="arguments for the factory: a JSON object or array")
    p.add_argument(
        "--weights",
        type=Path,
        metavar="CKPT",
        help="safetensors file, state_dict file (.pt/.pth, weights_only) or DCP checkpoint folder",
    )
    p.add_argument(
        "--example",
        action="append",
        default=[],
        metavar="SPEC",
        required=True,
        help="one model input: 'float32[1,1,8,8]', 'int64[1,16]:0..1000', 'x=inputs.npy' or a .safetensors "
        "file; repeat for several inputs, in forward() order",
    )
    p.add_argument(
        "--formats",
        default="onnx,exported",
        help="comma list of onnx, exported, torchscript (default onnx,exported)",
    )
    p.add_argument(
        "--dynamic",
        default="batch",
        metavar="AXES",
        help="dynamic dimensions by position, the same for every input: 'batch' (default), 'none', or e.g. "
        "'batch,seq' / 'batch,seq:512' (a bound) / 'batch,_,h,w' ('_' keeps a dimension fixed); each is checked "
        "at several sizes",
    )
    p.add_argument(
        "--opset",
        type=int_type("--opset", minimum=1, maximum=1000),
        metavar="N",
        help="ONNX opset to write (default: the exporter's); 18 up to what the installed onnxruntime runs",
    )
    p.add_argument(
        "--max-batch",
        type=int_type("--max-batch", minimum=1, maximum=MAX_BATCH),
        default=32,
        help="largest batch exported and checked (default 32)",
    )
    p.add_argument(
        "--quantize",
        choices=["int8-dynamic", "int8-static"],
        help="also write an int8 ONNX model: int8-dynamic (Linear layers), or int8-static (calibrated, for conv "
        "nets; kept only when the latency table shows it faster and it is within tolerance)",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="training samples for --quantize int8-static: a .npy (one input) or .safetensors (one array per "
        "input), first dim the samples (default: the --example files' rows, else random rows)",
    )
    p.add_argument(
        "--out", type=Path, help="bundle folder (default scalpel-runs/<time>-bundle/); must be new or empty"
    )
    p.add_argument(
        "--atol",
        type=float_type("--atol"),
        help="override the per-dtype absolute tolerance of the parity check",
    )
    p.add_argument(
        "--rtol",
        type=float_type("--rtol"),
        help="override the per-dtype relative tolerance of the parity check",
    )
    p.add_argument(
        "--output-names", help="comma list of output names (default output, or output_0, output_1...)"
    )
    p.add_argument(
        "--preprocess",
        metavar="JSON",
        help='preprocessing steps serve applies to raw inputs (\'{"steps": [{"op": "normalize", ...}]}\', see '
        "docs/export.md), or any other JSON object: metadata stored in the manifest for clients",
    )
    p.add_argument(
        "--transform",
        metavar="[INPUT=]MODULE:NAME",
        help="the training script's evaluation transform (a torchvision-style Compose, or a function returning it "
        "or the Dataset): recorded as data, applied by serve to raw inputs, checked against the original",
    )
    p.add_argument(
        "--transform-from",
        metavar="RUN[:N]",
        help="read the transform from a recorded run (scalpel profile/doctor/run of the training script): the "
        "dataset transform of its DataLoader N (default: the first without random augmentation), as data",
    )
    p.add_argument(
        "--raw-example",
        type=Path,
        metavar="PATH.npy",
        help="raw samples (first dim the samples, e.g. uint8 N,H,W,C images) for the preprocessing parity check "
        "(default: random samples of the recorded raw shape)",
    )
    p.add_argument(
        "--layer-diff",
        action="store_true",
        help="compare every layer's output between eager and each ONNX/.pt2 export and name the first beyond "
        "tolerance, with statistics (done for any form that fails parity anyway)",
    )
    p.add_argument(
        "--precision",
        metavar="LIST",
        help="also build reduced-precision forms: fp16 (the ONNX export converted by onnxruntime's float16 "
        "converter) and/or bf16 (a bfloat16 torch.export program); each is timed beside its fp32 peer and kept "
        "only where parity with fp32 eager holds within its dtype's tolerance",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="time a torch.compile'd .pt2 program (pt2+compile, after a warm-up at each batch) beside the "
        "others, with its parity; what 'scalpel serve --backend torch --compile' runs",
    )
    p.add_argument(
        "--trust", action="store_true", help="allow a weights file that needs full unpickling (runs code)"
    )
    p.add_argument(
        "--sign-key",
        type=Path,
        metavar="FILE",
        help="HMAC key file: a torchscalpel checkpoint must carry a matching signature "
        "(written by Checkpointer(sign_key=FILE)), and the bundle's manifest is signed with it "
        "(manifest.sig, checked by 'scalpel serve --sign-key'); detects tampering, not only corruption",
    )
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="load weights holding NaN, infinity or magnitudes over 1e10 (refused by default: a corrupt checkpoint)",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        type=Path,
        metavar="FILE",
        help="also write the manifest to this file (- for standard output)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate the flags, run the export, print parity and latency; exit 1 when parity fails."""
    if args.weights is not None and not args.weights.exists():  # before importing torch: fail in a blink
        raise UsageError(f"--weights {args.weights} does not exist; check the path.")
    if args.calibration is not None and not args.calibration.is_file():
        raise UsageError(
            f"--calibration {args.calibration} does not exist; give a .npy or .safetensors of samples."
        )
    if args.raw_example is not None and not args.raw_example.is_file():
        raise UsageError(f"--raw-example {args.raw_example} does not exist; give a .npy file of raw samples.")
    if args.raw_example is not None and not (args.transform or args.preprocess or args.transform_from):
        raise UsageError(
            "--raw-example feeds the preprocessing parity check; add --transform, --transform-from or --preprocess."
        )
    if args.sign_key is not None:  # before any work: a bad key used to surface after the whole export
        _check_sign_key(args)
    _validate(args)
    from torchscalpel.ship.export import ExportOptions, export_bundle
    from torchscalpel.ship.parity import format_table
    from torchscalpel.ship.precision import parse_precisions

    try:
        precision = parse_precisions(args.precision)
    except ValueError as exc:
        raise UsageError(f"{exc}.") from None

    preprocess = None
    if args.preprocess:
        try:
            preprocess = json.loads(args.preprocess)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--preprocess is not valid JSON ({exc.msg}).") from None
    opts = ExportOptions(
        model=args.model,
        factory_args=args.factory_args,
        weights=args.weights,
        examples=list(args.example),
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
        dynamic=args.dynamic,
        opset=args.opset,
        max_batch=args.max_batch,
        quantize=args.quantize,
        calibration=args.calibration,
        out=args.out or default_run_dir("bundle"),
        atol=args.atol,
        rtol=args.rtol,
        output_names=[n.strip() for n in args.output_names.split(",")] if args.output_names else None,
        preprocess=preprocess,
        transform=args.transform,
        transform_from=args.transform_from,
        layer_diff=args.layer_diff,
        raw_example=args.raw_example,
        trust=args.trust,
        sign_key=args.sign_key,
        allow_nonfinite=args.allow_nonfinite,
        precision=precision,
        compile=args.compile,
    )
    result = export_bundle(opts)
    print(format_table(result.checks))
    for batch, row in result.manifest["latency_ms"].items():
        print(f"latency at batch {batch}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in row.items()))
    for name, why in (result.manifest.get("forms_absent") or {}).items():
        print(f"no {name} row: {why}")
    for key, report in (result.manifest.get("precision") or {}).items():
        print(f"{key}: {'kept' if report['kept'] else 'dropped'} ({report.get('reason', '')})")
    if args.json_path:
        write_output_text(args.json_path, json.dumps(result.manifest, indent=2), flag="--json")
    if not result.passed:
        failed = [c for c in result.checks if not c.passed]
        worst = max(failed, key=lambda c: c.max_abs)
        print(
            f"scalpel: error: parity failed for {len(failed)} check(s) (worst: {worst.format} at batch {worst.batch}, "
            f"max abs {worst.max_abs:.3g} > atol {worst.atol:g}); the bundle in {result.path} is marked failed "
            "and serve will refuse it."
        )
        return 1
    print(f"bundle: {result.path} (parity passed)")
    return 0


def _check_sign_key(args: argparse.Namespace) -> None:
    """--sign-key needs a torchscalpel checkpoint as --weights, and a readable key of 16+ bytes (exit 2 otherwise)."""
    if args.weights is None or not args.weights.is_dir():
        raise UsageError(
            "--sign-key checks a torchscalpel checkpoint's signed manifest and signs the bundle; point --weights "
            "at the checkpoint folder, or drop --sign-key."
        )
    from torchscalpel.distributed.manifest import CheckpointError, read_key

    try:
        read_key(args.sign_key)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None


def _validate(args: argparse.Namespace) -> None:
    """Bad numbers and impossible example sizes, refused before torch is imported or anything allocated."""
    if not 1 <= args.max_batch <= MAX_BATCH:
        raise UsageError(f"--max-batch {args.max_batch} must be between 1 and {MAX_BATCH}.")
    for spec in args.example:
        m = _SPEC.match(spec)
        if m is None:
            continue  # a file or a malformed spec: ship.specs says which, in its own sentence
        try:
            dims = [int(d) for d in m.group("shape").replace(" ", "").split(",") if d]
        except ValueError:
            raise UsageError(
                f"--example {spec!r}: the shape must be whole numbers, e.g. 'float32[1,3,224,224]'."
            ) from None
        if not dims or min(dims) < 1:
            raise UsageError(f"--example {spec!r} needs a shape with a batch dimension and no zero sizes.")
        rows = max(dims[0], args.max_batch)
        size = rows * _ITEMSIZE.get(m.group("dtype"), 8)
        for d in dims[1:]:
            size *= d
            if size > MAX_EXAMPLE_BYTES:
                break
        if size > MAX_EXAMPLE_BYTES:
            raise UsageError(
                f"--example {spec!r} needs over {MAX_EXAMPLE_BYTES >> 30} GiB at batch {rows}; give a "
                "smaller shape (or a smaller --max-batch)."
            )

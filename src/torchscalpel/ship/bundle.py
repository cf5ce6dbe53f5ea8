"""The bundle: a folder with the weights, the exported files and ``manifest.json``.

The manifest carries a ``format_version`` (``MAJOR.MINOR``; readers reject a newer major), the
model's input and output names, shapes (``null`` for dynamic dims), dtypes, dynamic dims, optional
preprocessing metadata, the parity figures, latency, and the SHA-256 of every file, which
:func:`verify_bundle` checks before anything is loaded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from torchscalpel.errors import RecordVersionError, ScalpelError, UsageError
from torchscalpel.fileio import atomic_write_text, sha256_file

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
"""HMAC-SHA256 of manifest.json's bytes under the user's key (``--sign-key``): tamper evidence."""
FORMAT = "torchscalpel-bundle"
FORMAT_VERSION = "1.0"
ARTIFACT_FILES = {
    "weights": "model.safetensors",
    "onnx": "model.onnx",
    "onnx_int8": "model.int8.onnx",
    "exported": "model.pt2",
    "torchscript": "model.torchscript.pt",
    "onnx_fp16": "model.fp16.onnx",
    "exported_bf16": "model.bf16.pt2",
    "tokenizer": "tokenizer.json",
}
"""Artifact kind -> file name inside the bundle."""
CODE_ARTIFACTS = ("exported", "torchscript", "exported_bf16")
"""Artifacts that unpickle code when loaded: serve loads them only with ``--trust``."""


def hash_files(folder: Path) -> dict[str, str]:
    """SHA-256 of every file in ``folder`` except the manifest (relative POSIX paths)."""
    return {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in (MANIFEST, SIGNATURE)
    }


def write_manifest(folder: Path, manifest: dict[str, Any], *, key: bytes | None = None) -> Path:
    """Write ``manifest.json`` atomically (a crash never leaves half a manifest); with ``key``, also
    ``manifest.sig``, the HMAC-SHA256 of the manifest's bytes (the SHA-256 list alone detects
    corruption, not someone who can rewrite the hashes too)."""
    path = folder / MANIFEST
    text = json.dumps(manifest, indent=2, sort_keys=False) + "\n"
    atomic_write_text(path, text)
    if key is not None:
        atomic_write_text(folder / SIGNATURE, _signature(key, text.encode("utf-8")) + "\n")
    return path


def _signature(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def check_signature(folder: Path, key: bytes) -> None:
    """Refuse a bundle whose manifest.sig is missing or does not match ``key`` (one sentence)."""
    sig_path = folder / SIGNATURE
    try:
        have = sig_path.read_text(encoding="ascii").strip()
        data = (folder / MANIFEST).read_bytes()
    except (OSError, UnicodeDecodeError):
        raise ScalpelError(
            f"Bundle {folder} carries no readable {SIGNATURE}; export it with --sign-key, "
            "or serve it without --sign-key."
        ) from None
    if not hmac.compare_digest(have, _signature(key, data)):
        raise ScalpelError(
            f"Bundle {folder}'s manifest does not match its signature under this key: it was "
            "changed after export, or signed with another key; re-export it."
        )


@dataclass(kw_only=True, slots=True)
class Bundle:
    """A verified bundle: its folder and parsed manifest."""

    path: Path
    manifest: dict[str, Any]

    def file(self, kind: str) -> Path | None:
        """Path of an artifact kind (``onnx``, ``exported``...) if the bundle has it."""
        name = self.manifest.get("artifacts", {}).get(kind)
        return self.path / name if name else None

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """Input specs: name, dtype, shape (``None`` for dynamic dims)."""
        return list(self.manifest["inputs"])

    @property
    def outputs(self) -> list[dict[str, Any]]:
        """Output specs: name, dtype, shape."""
        return list(self.manifest["outputs"])

    @property
    def max_batch(self) -> int:
        """Largest batch the export was checked at."""
        return int(self.manifest.get("max_batch", 1))


MAX_MANIFEST_BYTES = 16 << 20
"""A manifest is a few kB; a bigger file is not one export wrote."""
MAX_INPUT_BYTES = 1 << 32
"""Largest input (or output) one model call may take at the bundle's max batch (4 GiB)."""
DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
"""Tensor dtypes a manifest may name (what export writes and the server can decode)."""
_ITEMSIZE = {
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "bool": 1,
}


try:
    import msgspec
except ImportError:  # pragma: no cover - msgspec ships with the serve and trace extras
    msgspec = None  # type: ignore[assignment]

if msgspec is not None:
    _Dim = Annotated[int, msgspec.Meta(ge=1, le=1 << 40)]
    _Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    _Path = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    _Sha = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]

    class _TensorSpec(msgspec.Struct):
        name: _Name
        dtype: str
        shape: Annotated[list[_Dim | None], msgspec.Meta(max_length=16)]
        dynamic_dims: dict[str, str] = {}
        range: Annotated[list[int], msgspec.Meta(min_length=2, max_length=2)] | None = None

    class _Parity(msgspec.Struct):
        passed: bool

    class _Model(msgspec.Struct, rename={"class_": "class"}):
        class_: str | None = None

    class _ManifestSchema(msgspec.Struct):
        """The fields readers use, with their types; unknown fields are allowed (newer minors add some)."""

        format: str
        format_version: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,4}\.[0-9]{1,4}$")]
        model: _Model
        inputs: Annotated[list[_TensorSpec], msgspec.Meta(min_length=1, max_length=256)]
        outputs: Annotated[list[_TensorSpec], msgspec.Meta(min_length=1, max_length=256)]
        parity: _Parity
        max_batch: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 1
        artifacts: dict[_Name, _Name] = {}
        files: dict[_Path, _Sha] = {}


def axis_bounds(manifest: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Named dynamic axes besides the batch -> (max, example size), from ``manifest["axes"]`` (checked)."""
    out: dict[str, tuple[int, int]] = {}
    axes = manifest.get("axes") or {}
    if not isinstance(axes, dict):
        return out
    for name, entry in axes.items():
        if name == "batch" or not isinstance(entry, dict):
            continue
        hi, example = entry.get("max"), entry.get("example")
        if (
            isinstance(hi, int)
            and isinstance(example, int)
            and not isinstance(hi, bool)
            and not isinstance(example, bool)
            and 1 <= example <= hi <= 1 << 24
        ):
            out[str(name)] = (hi, example)
    return out


def _check_tensors(
    kind: str, specs: list[dict[str, Any]], max_batch: int, bounds: dict[str, tuple[int, int]] | None = None
) -> str | None:
    """What is wrong with the ``inputs``/``outputs`` list beyond field types, or None."""
    bounds = bounds or {}
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        return f"{kind} names are not unique"
    for spec in specs:
        label = f"{kind[:-1]} {spec['name'][:60]!r}"
        if spec["dtype"] not in DTYPES:
            return f"{label} has dtype {str(spec['dtype'])[:40]!r}, not one of {', '.join(DTYPES)}"
        shape = spec["shape"]
        if not shape:
            return f"{label} has no batch dimension"
        named = spec.get("dynamic_dims") or {}
        for d, dim in enumerate(shape[1:], start=1):
            if dim is None and named.get(str(d)) not in bounds:
                return f"{label} has a dynamic dimension {d} with no bounded axis in the manifest's axes"
        rows = max_batch if shape[0] is None else shape[0]
        size = rows * _ITEMSIZE[spec["dtype"]]
        for d, dim in enumerate(shape[1:], start=1):
            size *= dim if dim is not None else bounds[named[str(d)]][0]
        if size > MAX_INPUT_BYTES:
            return f"{label} of shape {shape} takes {size:.3g} bytes at batch {rows}, over the {MAX_INPUT_BYTES >> 30} GiB limit"
        rng = spec.get("range")
        if rng is not None and (
            spec["dtype"] in ("float16", "float32", "float64", "bool") or rng[0] >= rng[1]
        ):
            return f"{label} has a range {rng} that is not [low, high) of an integer input"
    return None


def validate_manifest(manifest: Any, path: Path) -> None:
    """Check the manifest against its schema; raise :class:`UsageError` (one sentence) naming the first problem."""
    if msgspec is None:  # pragma: no cover
        raise UsageError("Reading a bundle needs msgspec; run 'pip install msgspec'.")
    try:
        msgspec.convert(manifest, _ManifestSchema)
    except msgspec.ValidationError as exc:
        raise UsageError(
            f"{path} does not match the bundle manifest schema ({str(exc)[:200]}); "
            "re-run 'scalpel export' rather than editing it."
        ) from None
    inputs, outputs, max_batch = manifest["inputs"], manifest["outputs"], manifest.get("max_batch", 1)
    bounds = axis_bounds(manifest)
    problem = _check_tensors("inputs", inputs, max_batch, bounds) or _check_tensors(
        "outputs", outputs, max_batch, bounds
    )
    if problem is None:
        batches = {s["shape"][0] for s in inputs}
        if len(batches) > 1 and None in batches:
            problem = "some inputs have a dynamic batch and others a fixed one"
        elif None not in batches and batches != {max_batch}:
            problem = f"a fixed-batch export has max_batch {max_batch} but inputs of batch {sorted(batches)}"
    if problem is None:
        for kind, name in manifest.get("artifacts", {}).items():
            if "/" in name or "\\" in name or name in (".", ".."):
                problem = f"the {kind[:40]} artifact {name[:80]!r} is not a plain file name"
                break
    if problem is not None:
        raise UsageError(f"{path} is not a valid bundle manifest: {problem}; re-run 'scalpel export'.")
    from torchscalpel.ship.preprocess import check_spec, is_spec
    from torchscalpel.ship.textprep import check_text_spec, is_text_spec

    if is_text_spec(manifest.get("preprocessing")):
        try:
            text = check_text_spec(manifest["preprocessing"], [s["name"] for s in inputs])
        except UsageError as exc:
            raise UsageError(f"{path} is not a valid bundle manifest: {exc}") from None
        if (manifest.get("artifacts") or {}).get("tokenizer") != text["tokenizer"]["file"]:
            raise UsageError(
                f"{path} is not a valid bundle manifest: its tokenizer file {text['tokenizer']['file'][:80]!r} is "
                "not a hashed artifact; re-run 'scalpel export'."
            )
    elif is_spec(manifest.get("preprocessing")):
        try:
            check_spec(manifest["preprocessing"], [s["name"] for s in inputs])
        except UsageError as exc:
            raise UsageError(f"{path} is not a valid bundle manifest: {exc}") from None


def read_manifest(folder: Path) -> dict[str, Any]:
    """Parse, schema-check and version-check ``manifest.json`` (no hashing); every refusal is one sentence."""
    if not folder.is_dir():
        raise UsageError(f"Bundle {folder} is not a folder; pass the --out folder of 'scalpel export'.")
    path = folder / MANIFEST
    if not path.is_file():
        raise UsageError(f"{folder} has no {MANIFEST}; pass a folder written by 'scalpel export'.")
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"Cannot read {path} ({exc.strerror}).") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise UsageError(
            f"{path} is over {MAX_MANIFEST_BYTES >> 20} MiB, which no export writes; re-run 'scalpel export'."
        )
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON or bytes; RecursionError: deep nesting
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:120]
        raise UsageError(f"{path} is not valid JSON ({reason}); re-run 'scalpel export'.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UsageError(f"{path} is not a torchscalpel bundle manifest; re-run 'scalpel export'.")
    version = manifest.get("format_version")
    major = version.partition(".")[0] if isinstance(version, str) and len(version) <= 9 else ""
    if major.isdigit() and int(major) > int(FORMAT_VERSION.split(".")[0]):
        raise RecordVersionError(
            f"Bundle format {version} is newer than this torchscalpel reads ({FORMAT_VERSION}); upgrade torchscalpel."
        )
    validate_manifest(manifest, path)
    return manifest


def verify_bundle(folder: Path, *, key: bytes | None = None) -> Bundle:
    """Read the manifest and check every listed file's SHA-256; raise naming each mismatch. With
    ``key``, the manifest's HMAC signature is checked first."""
    if key is not None:
        check_signature(folder, key)
    manifest = read_manifest(folder)
    files = manifest.get("files") or {}
    problems = []
    root = folder.resolve()
    for rel, want in files.items():
        shown = rel[:80]
        try:
            target = (folder / rel).resolve()
            if root not in target.parents:
                problems.append(f"{shown} points outside the bundle")
            elif not target.is_file():
                problems.append(f"{shown} is missing")
            elif sha256_file(target) != want:
                problems.append(f"{shown} has changed")
        except (
            OSError,
            RuntimeError,
            ValueError,
        ):  # symlink loop (RuntimeError on 3.11), NUL byte, unreadable
            problems.append(f"{shown} cannot be resolved or read (a symlink loop?)")
        if len(problems) >= 5:
            break
    for kind, name in (manifest.get("artifacts") or {}).items():
        if name not in files:
            problems.append(f"{kind} file {name} has no hash in the manifest")
    if problems:
        raise ScalpelError(
            f"Bundle {folder} failed verification ({'; '.join(problems)}); re-export it rather than serving modified files."
        )
    if manifest["parity"]["passed"] is not True:
        raise ScalpelError(f"Bundle {folder} did not pass its parity check at export; fix the export first.")
    return Bundle(path=folder, manifest=manifest)
